"""The SFT warm start (the paper's pi_SFT): LoRA adapters fitted on the best-judged replies and directions.

GRPO from a bare base spends its first steps learning the format. The MASCOT recipe first
fine-tunes on the best the data holds, then uses that model as the candidate sampler and
as the policy GRPO starts from. Here:

- **speaker rows**: for each context of the persona pairs (``mascot pairs``), the reply
  that won with the highest label, when it is no refusal, help-desk talk, copy or reply
  spoken as the person (``graphs.faults``);
- **Director rows**: for each decision point of the group pairs, the direction of the
  block that won with the highest label (the block file gives the direction, the episodes
  the Director's prompt at that point), when the model wrote it valid.

Both are TRL prompt-completion rows (conversational), trained with TRL's ``SFTTrainer`` on
the completion only, one LoRA adapter each. ``init_adapter`` in a GRPO recipe (or
``train-speakers --init_adapter``) goes on training one of them; a policy file of them is
the candidate sampler (``mascot candidates --policies``) and the ``sft`` system of
``mascot eval``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from datasets import Dataset
from transformers import TrainerCallback
from trl import SFTConfig, SFTTrainer

from mascot.graphs.faults import reply_fault
from mascot.policies.thinking import chat_template_kwargs
from mascot.training.fitting.adapter_folder import adapter_target
from mascot.training.fitting.lora_run import LoraRun, fit_lora
from mascot.training.fitting.recipe import LoraRecipe

logger = logging.getLogger(__name__)

#: What a direction completion holds: the fields the Director's model writes.
DIRECTION_FIELDS = ("speaker", "action", "tone", "addressee", "rationale")


class WarmStartError(ValueError):
    """The warm start cannot be fitted; the message is one line."""


@dataclass
class WarmStartConfig(LoraRecipe):
    """Our knobs for the SFT warm start (LoRA only); TRL's ``SFTConfig`` (``training``)
    holds the trainer's (``num_train_epochs``, ``learning_rate``, ``max_length``, ...)."""

    trainer_config: ClassVar[type] = SFTConfig
    subject: ClassVar[str] = "warm-start"
    trainer_defaults: ClassVar[dict[str, Any]] = {
        "logging_steps": 1, "per_device_train_batch_size": 4, "num_train_epochs": 2, "max_length": 2048,
        "completion_only_loss": True,
    }


@dataclass(frozen=True)
class WarmStartRows:
    """Rows for one warm-start adapter and what was left out: ``contexts`` seen, and how
    many winners were dropped for a fault (``faults``: fault name -> count) or an invalid
    direction (``invalid``)."""

    rows: list[dict[str, Any]]
    contexts: int
    faults: dict[str, int]
    invalid: int = 0


def best_winners(pairs: Iterable[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Per ``context_id``, the pair whose chosen side has the highest label (``chosen_overall``);
    ties keep the first."""
    best: dict[str, Mapping[str, Any]] = {}
    for pair in pairs:
        held = best.get(pair["context_id"])
        if held is None or pair["chosen_overall"] > held["chosen_overall"]:
            best[pair["context_id"]] = pair
    return best


def speaker_rows(pairs: Iterable[Mapping[str, Any]]) -> WarmStartRows:
    """The speakers' SFT rows: the best-judged winning reply of each context, without faults.

    Args:
        pairs: Persona preference pairs (``mascot pairs`` rows).
    """
    faults: dict[str, int] = {}
    rows = []
    best = best_winners(pairs)
    for pair in best.values():
        reply = pair["chosen"][0]["content"]
        person = next((m["content"] for m in reversed(pair["prompt"]) if m["role"] == "user"), "")
        fault = reply_fault(reply, person=person)
        if fault or not reply.strip():
            faults[fault or "empty"] = faults.get(fault or "empty", 0) + 1
            continue
        rows.append({"prompt": list(pair["prompt"]), "completion": [{"role": "assistant", "content": reply}],
                     "persona": pair["persona"], "context_id": pair["context_id"]})
    return WarmStartRows(rows=rows, contexts=len(best), faults=faults)


def director_rows(group_pairs: Iterable[Mapping[str, Any]], blocks: Sequence[Any],
                  prompts: Mapping[str, Sequence[Mapping[str, str]]]) -> WarmStartRows:
    """The Director's SFT rows: at each decision point, the direction of the best-judged
    winning block, as the JSON the Director's model writes.

    Args:
        group_pairs: Group preference pairs of sibling blocks (``context_id`` = decision point).
        blocks: The sibling blocks (``BlockCandidate``) the pairs were judged from.
        prompts: Decision point id -> the Director's prompt there (``DecisionPoint.prompt``).

    Raises:
        WarmStartError: if a winning block is not in ``blocks`` or its point not in ``prompts``.
    """
    by_sample = {(b.context_id, b.sample): b for b in blocks}
    rows, invalid = [], 0
    best = best_winners(group_pairs)
    for context_id, pair in best.items():
        sample = pair.get("provenance", {}).get("chosen", {}).get("sample")
        block = by_sample.get((context_id, sample))
        if block is None:
            raise WarmStartError(f"group pair of point {context_id}: its block (sample {sample}) is not in the blocks")
        if context_id not in prompts:
            raise WarmStartError(f"decision point {context_id} is not in the episodes; give the episodes the blocks "
                                 "were played from")
        if block.validity != "valid":
            invalid += 1
            continue
        direction = {k: block.direction[k] for k in DIRECTION_FIELDS if block.direction.get(k) is not None}
        rows.append({"prompt": [dict(m) for m in prompts[context_id]],
                     "completion": [{"role": "assistant", "content": json.dumps(direction, ensure_ascii=False)}],
                     "persona": "director", "context_id": context_id})
    return WarmStartRows(rows=rows, contexts=len(best), faults={}, invalid=invalid)


def train_warm_start(
    rows: Sequence[Mapping[str, Any]],
    *,
    base: str,
    name: str,
    out: str | Path,
    config: WarmStartConfig | Mapping[str, Any] | None = None,
    callbacks: Sequence[TrainerCallback] = (),
    data: str | None = None,
) -> LoraRun:
    """Fit one LoRA adapter with TRL's ``SFTTrainer`` on prompt-completion rows, saved to ``out/<name>``.

    Args:
        rows: ``speaker_rows(...).rows`` or ``director_rows(...).rows``.
        base: A local model directory or a cached Hub id.
        name: The adapter's name (``speakers``, ``director`` or a persona id).
        out: The adapters folder; checkpoints go to ``out/checkpoints/<name>``, a rerun resumes.
        config: Our settings, or a mapping for ``WarmStartConfig.from_dict``.
        callbacks: ``transformers`` trainer callbacks.
        data: What the rows came from, for the card.

    Returns:
        The run (its card has the loss and token-accuracy curve).

    Raises:
        WarmStartError: on no rows, or no chat template.
        AdapterFolderError: on an unusable ``out``.
    """
    if not isinstance(config, WarmStartConfig):
        config = WarmStartConfig.from_dict(config or {})
    if not rows:
        raise WarmStartError(f"no rows to fine-tune '{name}' on (no winning reply or direction without a fault)")
    target = adapter_target(out, name)
    dataset = Dataset.from_list([{"prompt": list(r["prompt"]), "completion": list(r["completion"]),
                                  "chat_template_kwargs": chat_template_kwargs()} for r in rows])

    def build(model: Any, tokenizer: Any, args: Any) -> SFTTrainer:
        return SFTTrainer(model, args=args, train_dataset=dataset, processing_class=tokenizer,
                          peft_config=config.lora_config(model), callbacks=list(callbacks))

    return fit_lora(base=base, target=target, method="sft", recipe=config, build=build, role=name,
                    conversational=True, error=WarmStartError, data=data)
