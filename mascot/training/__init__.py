"""Training pipeline: rollouts, judging, preference pairs, reward models, GRPO/DPO, evaluation."""

from mascot.redaction import Redactor
from mascot.training.data.candidates import Candidate, candidate_contexts, read_candidates, sample_candidates
from mascot.training.data.pairs import PairsError, build_pairs, read_pairs, write_pairs
from mascot.training.episodes.checkpoint_import import (
    CheckpointImportError,
    ImportReport,
    import_checkpoints,
)
from mascot.training.episodes.episode import (
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
from mascot.training.episodes.rollout import (
    PlannedEpisode,
    RolloutError,
    RolloutStatus,
    collect_episodes,
    plan_episodes,
)
from mascot.training.episodes.trace import JsonlTracer
from mascot.training.evaluation.metrics import episode_metrics
from mascot.training.jsonl import JsonlAppender, JsonlError
from mascot.training.judging.agreement import agreement
from mascot.training.judging.judge import Judge, JudgePanel
from mascot.training.judging.judgement import JudgedCandidate, Judgement, JudgementCache, read_judgements
from mascot.training.judging.rubric import Rubric, RubricError, list_rubrics, load_rubric
from mascot.training.judging.targets import block_targets, reply_target, reply_targets
from mascot.training.retry import model_retry_policy, transient_error

__all__ = [
    "SCHEMA_VERSION",
    "Candidate",
    "CheckpointImportError",
    "Episode",
    "EpisodeError",
    "EpisodeMessage",
    "EpisodeSource",
    "ImportReport",
    "JsonlAppender",
    "JsonlError",
    "JsonlTracer",
    "Judge",
    "JudgePanel",
    "JudgedCandidate",
    "Judgement",
    "JudgementCache",
    "PairsError",
    "PlannedEpisode",
    "Redactor",
    "RolloutError",
    "RolloutStatus",
    "Rubric",
    "RubricError",
    "TurnPolicy",
    "Usage",
    "agreement",
    "block_targets",
    "build_pairs",
    "candidate_contexts",
    "collect_episodes",
    "episode_from_state",
    "episode_metrics",
    "import_checkpoints",
    "list_rubrics",
    "load_rubric",
    "model_retry_policy",
    "plan_episodes",
    "read_candidates",
    "read_episodes",
    "read_judgements",
    "read_pairs",
    "reply_target",
    "reply_targets",
    "sample_candidates",
    "transient_error",
    "write_pairs",
]
