"""The pipeline's learning by selection: ``selection`` in a recipe, as ``mascot`` commands.

Expert iteration with verifiers, the path that learns on a CPU: each iteration samples ``k``
directions per train decision point and ``k`` replies per persona turn from the policy (the
base model first, then the adapters of the iteration before) and from a ``teacher``, drops
every sample a fault verifier rejects, plays each passing direction as a one-turn block
(``mascot samples --play``), and fits both adapters by SFT from the base model on the best of
each group by the measured outcomes (``mascot train-sft --samples``: ``training.data.selection``).
After the last iteration, best-against-worst pairs from the same groups (``mascot pairs
--samples``) feed one DPO pass of each adapter from the last iteration's (``dpo``; TRL's
``loss_type: [sigmoid, sft]`` in its recipe keeps an SFT term). The evaluation plays the
DPO adapters as ``trained`` and the last iteration as ``sft``. Reward models and GRPO are
left out of such a run.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field


class SelectionStage(BaseModel):
    """``selection:`` of a pipeline recipe."""

    model_config = ConfigDict(extra="forbid")

    iterations: int = Field(default=2, ge=1)  # sample, select, fine-tune from the base: this many times
    k: int = Field(default=4, ge=1)  # samples per context and source
    teacher: str | None = None  # a stronger model that samples too (a folder or Hub id)
    keep: int = Field(default=1, ge=1)  # best distinct passing samples per context that SFT learns
    play: bool = True  # play passing directions as one-turn blocks to rank them
    max_points: int | None = Field(default=None, ge=1)
    max_contexts: int | None = Field(default=None, ge=1)
    sft: str | None = None  # the SFT recipe of each iteration (a YAML file)
    dpo: str | None = None  # the DPO recipe after the last iteration; none: no DPO pass
    min_margin: float = Field(default=0.2, ge=0)  # of the measured scores, for pairs without a faulty sample
    timeout: float | None = Field(default=None, gt=0)  # seconds per request (a slow teacher on a CPU needs minutes)
    concurrency: int | None = Field(default=None, ge=1)  # requests at once while sampling


def selection_stages(selection: SelectionStage, *, roster: list[str], model: str, teacher: str | None,
                     episodes: str, base_policies: Path, out: Path, engine: list[str], budget: list[str],
                     seed: int, config: Callable[[str | None], list[str]]) -> tuple[list[tuple[str, list[str]]], Path]:
    """The stages of learning by selection, and the policy file the evaluation plays as trained.

    Args:
        selection: The recipe's section.
        roster: ``["--roster", ID]``.
        model: The base model.
        teacher: The teacher model (resolved), if any.
        episodes: The train episodes (rollout or import-logs).
        base_policies: The base model's policy file (the first iteration samples it).
        out: The run folder; each iteration writes ``out/select/N/``.
        engine: ``["--engine", "vllm"]`` or nothing.
        budget: The generating stages' ``--max-tokens`` flags.
        seed: The run's seed.
        config: A recipe file -> its ``--config`` flags.
    """
    plan: list[tuple[str, list[str]]] = []
    policies = base_policies
    folder = out / "select"
    last = folder
    for iteration in range(selection.iterations):
        last = folder / str(iteration)
        plan.append((f"select-{iteration}-samples", [
            "samples", "--in", episodes, *roster, "--policies", str(policies), *engine, "--k", str(selection.k),
            *(["--teacher-model", teacher] if teacher else []), *(["--play"] if selection.play else []),
            *(["--timeout", f"{selection.timeout:g}"] if selection.timeout else []),
            *(["--concurrency", str(selection.concurrency)] if selection.concurrency else []),
            *(["--max-points", str(selection.max_points)] if selection.max_points else []),
            *(["--max-contexts", str(selection.max_contexts)] if selection.max_contexts else []),
            *budget, "--seed", str(seed + iteration), "--out", str(last / "samples.jsonl")]))
        plan.append((f"select-{iteration}-sft", [
            "train-sft", *roster, "--base", model, "--samples", str(last / "samples.jsonl"), "--keep",
            str(selection.keep), *config(selection.sft), "--out", str(last)]))
        policies = last / "policies.yaml"
    if selection.dpo is None:
        return plan, policies
    adapters = out / "adapters"
    plan += [
        ("select-pairs", ["pairs", "--samples", str(last / "samples.jsonl"), *roster, "--min-margin",
                          str(selection.min_margin), "--seed", str(seed), "--out", str(folder / "pairs")]),
        ("select-dpo-speakers", ["train-speakers", *roster, "--method", "dpo", "--shared", "--base", model,
                                 "--pairs", str(folder / "pairs"), *config(selection.dpo),
                                 "--init_adapter", str(last / "speakers"), "--out", str(adapters)]),
        ("select-dpo-director", ["train-director", *roster, "--method", "dpo", "--base", model,
                                 "--pairs", str(folder / "pairs"), *config(selection.dpo),
                                 "--init_adapter", str(last / "director"), "--out", str(adapters)]),
    ]
    return plan, adapters / "policies.yaml"
