"""The pipeline recipe: one YAML file naming the roster, the base model, where episodes come
from, the judge and each stage's settings, validated into ``PipelineRecipe`` by
``load_recipe`` (``mascot pipeline --recipe FILE``; ``pipeline_run`` plays it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from mascot.cli.selection_stages import SelectionStage
from mascot.rosters.yaml_file import YamlFileError, first_error, read_yaml


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RolloutStage(_Section):
    scenarios: str | None = None
    profiles: str | None = None
    episodes: int = Field(default=8, ge=1)
    max_rounds: int = Field(default=1, ge=1)
    max_tokens: int | str | None = None  # --max-tokens: N or role=N,...; None: each role's default


class ImportStage(_Section):
    source: str = Field(alias="from", min_length=1)


class JudgeStage(_Section):
    model: str | None = None
    base_url: str | None = None
    api_key_env: str | None = None
    policies: str | None = None
    block_turns: int = Field(default=3, ge=1)  # turns of each sibling block the group rubric judges
    # judging modes measured on the sanity sets (judging.relative): the one that passes the gate
    # best labels the candidates and blocks; none passing, the metric judge labels
    modes: list[Literal["absolute", "ranking", "pairwise"]] = Field(default_factory=lambda: ["absolute"],
                                                                    min_length=1)


class GroupStage(_Section):
    """Sibling blocks for the group reward model (``mascot blocks``)."""

    g: int = Field(default=4, ge=2)  # blocks per decision point
    max_points: int | None = Field(default=None, ge=1)  # first N decision points only
    max_tokens: int | str | None = None


class CandidatesStage(_Section):
    """K sampled replies per persona turn (``mascot candidates``) for the persona judge."""

    k: int = Field(default=3, ge=2)
    max_contexts: int | None = Field(default=None, ge=1)  # first N persona turns only


class SamplesStage(_Section):
    """Rejection-sampled warm-start data (``mascot samples``): when given, ``sft`` fits on it."""

    k: int = Field(default=4, ge=1)  # samples per context and source
    teacher: str | None = None  # a stronger model that samples too (a folder or Hub id)
    keep: int = Field(default=2, ge=1)  # distinct passing samples per context that SFT learns
    max_points: int | None = Field(default=None, ge=1)
    max_contexts: int | None = Field(default=None, ge=1)


class TrainStage(_Section):
    config: str | None = None
    flags: list[str] = Field(default_factory=list)


class SpeakerStage(TrainStage):
    method: str = Field(default="grpo", pattern="^(grpo|dpo)$")


class DirectorStage(TrainStage):
    block_turns: int | None = Field(default=None, ge=1)


class EvalStage(_Section):
    scenarios: str | None = None
    episodes: int = Field(default=4, ge=1)
    baselines: list[str] = Field(default_factory=lambda: ["round_robin", "random", "zero_shot"])
    ablations: bool = False
    max_rounds: int = Field(default=1, ge=1)
    max_tokens: int | str | None = None
    rubrics: list[str] = Field(default_factory=lambda: ["persona", "group", "direction"])
    concurrency: int = Field(default=4, ge=1)  # episodes (and judgements) at once
    metrics_only: list[str] = Field(default_factory=list)  # systems measured but not judged


class PipelineRecipe(_Section):
    """A pipeline run. Relative paths are taken from the recipe file's folder."""

    roster: str
    model: str
    out: str
    rollout: RolloutStage | None = None
    import_logs: ImportStage | None = Field(default=None, alias="import-logs")
    judge: JudgeStage
    group_blocks: GroupStage = Field(default_factory=GroupStage, alias="group-blocks")
    candidates: CandidatesStage = Field(default_factory=CandidatesStage)  # K, or {k, max_contexts}
    min_margin: float = Field(default=0.5, ge=0)
    reward_models: TrainStage = Field(default_factory=TrainStage, alias="reward-models")
    # the SFT warm start (train-sft) on the best-judged replies and directions (or, with
    # `samples`, on the samples that passed the checks): when given, speaker and Director
    # training go on from its adapters and eval runs it as "sft"
    samples: SamplesStage | None = None
    sft: TrainStage | None = None
    # learning by selection (cli.selection_stages): when given, it replaces the judged pairs,
    # reward models and GRPO; eval plays its DPO adapters (or last iteration) as "trained"
    selection: SelectionStage | None = None
    speakers: SpeakerStage = Field(default_factory=SpeakerStage)
    director: DirectorStage = Field(default_factory=DirectorStage)
    eval: EvalStage = Field(default_factory=EvalStage)
    seed: int = 0
    # what runs the local models of the generating stages (rollout, blocks, candidates,
    # judge, eval): "vllm" runs one vLLM server per base model for the whole pipeline, into
    # which each stage loads the adapters it needs (those trained by earlier stages too)
    engine: Literal["local", "vllm"] = "local"

    @field_validator("candidates", mode="before")
    @classmethod
    def _candidates_k(cls, value: Any) -> Any:
        """``candidates: K`` is short for ``candidates: {k: K}``."""
        return {"k": value} if isinstance(value, int) else value


class PipelineError(ValueError):
    """A recipe is invalid or a stage failed; the message is one line."""


def load_recipe(path: str | Path) -> PipelineRecipe:
    """Read and validate a pipeline recipe.

    Raises:
        PipelineError: on a missing file, bad YAML, an unknown key, or neither or both of
            ``rollout`` and ``import-logs``.
    """
    path = Path(path)
    try:
        recipe = PipelineRecipe.model_validate(read_yaml(path))
    except YamlFileError as exc:
        raise PipelineError(str(exc)) from None
    except ValidationError as exc:
        where, problem = first_error(exc)
        raise PipelineError(f"{path}: {where}: {problem}") from None
    if (recipe.rollout is None) == (recipe.import_logs is None):
        raise PipelineError(f"{path}: give exactly one episode source, 'rollout' or 'import-logs'")
    return recipe
