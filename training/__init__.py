"""Training pipeline: rollouts, judging, preference pairs, reward models, GRPO/DPO, evaluation."""

from mascot.training.checkpoint_import import (
    CheckpointImportError,
    ImportReport,
    import_checkpoints,
)
from mascot.training.episode import (
    SCHEMA_VERSION,
    Episode,
    EpisodeError,
    EpisodeMessage,
    EpisodeSource,
    TurnPolicy,
    Usage,
    episode_from_state,
    read_episodes,
)
from mascot.training.jsonl import JsonlAppender, JsonlError
from mascot.training.redaction import Redactor
from mascot.training.retry import model_retry_policy, transient_error
from mascot.training.rollout import (
    PlannedEpisode,
    RolloutError,
    RolloutStatus,
    collect_episodes,
    plan_episodes,
)
from mascot.training.trace import JsonlTracer

__all__ = [
    "SCHEMA_VERSION",
    "CheckpointImportError",
    "Episode",
    "EpisodeError",
    "EpisodeMessage",
    "EpisodeSource",
    "ImportReport",
    "JsonlAppender",
    "JsonlError",
    "JsonlTracer",
    "PlannedEpisode",
    "Redactor",
    "RolloutError",
    "RolloutStatus",
    "TurnPolicy",
    "Usage",
    "collect_episodes",
    "episode_from_state",
    "import_checkpoints",
    "model_retry_policy",
    "plan_episodes",
    "read_episodes",
    "transient_error",
]
