"""Training pipeline: rollouts, judging, preference pairs, reward models, GRPO/DPO, evaluation."""

from mascot.redaction import Redactor
from mascot.training.data.block_rollout import BlockRollout, DecisionPoint, decision_points
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
from mascot.training.judging.judge_sanity import SanityReport, read_sanity_report, run_sanity
from mascot.training.judging.judgement import (
    JudgedCandidate,
    Judgement,
    JudgementCache,
    JudgeOutputError,
    read_judgements,
)
from mascot.training.judging.rubric import Rubric, RubricError, list_rubrics, load_rubric
from mascot.training.judging.sanity_set import SanityError, SanitySet, load_sanity_set
from mascot.training.judging.targets import block_targets, reply_target, reply_targets
from mascot.training.retry import model_retry_policy, transient_error
from mascot.training.rewards import (
    distinct_reward,
    format_reward,
    model_reward,
    redundancy_penalty_reward,
    roster_format_reward,
    round_redundancy_reward,
    weighted_rewards,
)

__all__ = [
    "SCHEMA_VERSION",
    "BlockRollout",
    "Candidate",
    "CheckpointImportError",
    "DecisionPoint",
    "Episode",
    "EpisodeError",
    "EpisodeMessage",
    "EpisodeSource",
    "ImportReport",
    "JsonlAppender",
    "JsonlError",
    "JsonlTracer",
    "Judge",
    "JudgeOutputError",
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
    "SanityError",
    "SanityReport",
    "SanitySet",
    "TurnPolicy",
    "Usage",
    "agreement",
    "block_targets",
    "build_pairs",
    "candidate_contexts",
    "collect_episodes",
    "decision_points",
    "distinct_reward",
    "episode_from_state",
    "episode_metrics",
    "format_reward",
    "import_checkpoints",
    "list_rubrics",
    "load_rubric",
    "load_sanity_set",
    "model_retry_policy",
    "model_reward",
    "plan_episodes",
    "read_candidates",
    "read_episodes",
    "read_judgements",
    "read_pairs",
    "read_sanity_report",
    "redundancy_penalty_reward",
    "reply_target",
    "reply_targets",
    "roster_format_reward",
    "round_redundancy_reward",
    "run_sanity",
    "sample_candidates",
    "transient_error",
    "weighted_rewards",
    "write_pairs",
]
