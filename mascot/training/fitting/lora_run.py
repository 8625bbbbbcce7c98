"""One LoRA training run: every trainer of mascot loads, resumes, saves and describes itself here.

Speaker GRPO, speaker DPO, the SFT warm start, the reward models and Director GRPO are each
one ``fit_lora`` call: the base model is resolved and loaded (a causal LM, or a sequence classifier with a
scalar ``score`` head for a reward model), the caller builds its TRL trainer on it, the run
resumes from the last checkpoint under ``OUT/checkpoints/<name>/`` if an interrupted one
left any, and the adapter is saved whole with one card, ``adapter_card.json`` plus a Hugging
Face ``README.md``. ``fit_grpo`` is the one GRPO run on top of it that the speakers and the
Director share (a prompt dataset and weighted reward terms). The card has the same fields for
every method:

- ``method`` (``grpo``, ``dpo``, ``sft``, ``reward_model``), ``role`` (persona, ``director``, or the
  reward model's folder name), ``init_adapter`` (the adapter the run went on training, or
  ``None`` for a new one), ``base`` and ``thinking`` (the chat template's thinking
  setting the prompts were rendered with);
- ``data`` (what the rows came from) and ``data_size`` (the rows trained on: prompts,
  decision points or pairs, after the trainer dropped any too long);
- ``steps``, ``train_loss``, and the reward curve: ``reward_metric`` (the logged value that
  is the method's reward: GRPO's weighted ``reward``, DPO's implicit ``rewards/margins``, SFT's
  ``mean_token_accuracy``, a reward model's ``margin`` between chosen and rejected), ``rewards`` (one value per logging
  step), ``reward_first`` and ``reward_last`` (the means of its first and last quarter);
- the method's own numbers (reward terms and weights, preference accuracies), ``seconds``,
  ``recipe`` (our settings and the trainer's), ``created_at`` and library ``versions``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from datasets import Dataset
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    TrainerCallback,
    set_seed,
)
from trl import GRPOTrainer
from trl.trainer.reward_trainer import suppress_seqcls_warning

from mascot.policies.local.model_loading import quiet_loading
from mascot.policies.model_source import resolve_model
from mascot.policies.thinking import chat_template_kwargs
from mascot.training.fitting.adapter_folder import (
    adapter_target,
    base_reference,
    checkpoint_dir,
    save_adapter,
    train_resuming,
)
from mascot.training.fitting.recipe import LoraRecipe
from mascot.training.rewards import RewardFunction, weighted_rewards

logger = logging.getLogger(__name__)

#: The logged value that is each method's reward curve.
REWARD_METRICS = {"grpo": "reward", "dpo": "rewards/margins", "reward_model": "margin",
                  "sft": "mean_token_accuracy"}
#: The TRL trainer behind each method, for the model card.
TRAINERS = {"grpo": "GRPOTrainer", "dpo": "DPOTrainer", "reward_model": "RewardTrainer", "sft": "SFTTrainer"}

Method = Literal["grpo", "dpo", "reward_model", "sft"]


@dataclass(frozen=True)
class LoraRun:
    """What one ``fit_lora`` call did: the saved folder, the base as given, the adapter's
    role and method, rows trained on, optimizer steps, mean loss, the reward curve with the
    means of its first and last quarter, the whole card, and wall time."""

    out: Path
    base: str
    role: str
    method: Method
    data_size: int
    steps: int
    train_loss: float
    rewards: list[float]
    reward_first: float | None
    reward_last: float | None
    card: dict[str, Any]
    seconds: float


def fit_lora(
    *,
    base: str,
    target: Path,
    method: Method,
    recipe: LoraRecipe,
    build: Callable[[Any, Any, Any], Any],
    conversational: bool,
    error: type[Exception],
    role: str | None = None,
    data: str | None = None,
    summary: Callable[[Any], Mapping[str, Any]] | None = None,
) -> LoraRun:
    """Load the base, build the trainer, train (resuming), save the adapter with its card.

    Args:
        base: A local model directory or a cached Hub id.
        target: The adapter's folder (checked by the caller, e.g. ``adapter_target``);
            checkpoints go to ``checkpoint_dir(target)``, and a rerun resumes from the last.
        method: ``grpo``, ``dpo`` and ``sft`` load a causal LM (with ``recipe.init_adapter``
            on it, trainable, when the recipe names one); ``reward_model`` a one-label
            sequence classifier in fp32, with the tokenizer's pad token set.
        recipe: Our settings; ``recipe.trainer_args`` gives the trainer's.
        build: ``(model, tokenizer, args) -> trainer``; the trainer gets the PEFT config
            from ``recipe.lora_config()``. It may raise ``error`` (e.g. every row too long).
        conversational: Whether the rows are chat messages (the tokenizer then needs a
            chat template).
        error: The caller's one-line error class, raised for a missing chat template.
        role: The adapter's role for the card; default the folder's name.
        data: What the rows came from (e.g. the episode file), for the card.
        summary: ``trainer -> card fields`` after training, the method's own numbers.

    Returns:
        The run; the same numbers are in ``target/adapter_card.json``.

    Raises:
        LocalModelError: if the base model cannot be loaded from anywhere.
        error: on no chat template for conversational rows, or whatever ``build`` raises.
    """
    started = time.monotonic()
    source = resolve_model(base)
    args = recipe.trainer_args(checkpoint_dir(target))
    args.output_dir = str(checkpoint_dir(target))
    set_seed(args.seed)  # a reward model's head starts random
    tokenizer = AutoTokenizer.from_pretrained(source)
    if conversational and not tokenizer.chat_template:
        raise error(f"the tokenizer of {base} has no chat template; conversational rows need one")
    with quiet_loading():
        model = load_base_model(source, method, tokenizer, bf16=bool(args.bf16))
        if recipe.init_adapter:
            model = _with_adapter(model, recipe.init_adapter, method, error)
        trainer = build(model, tokenizer, args)
        result = train_resuming(trainer)
    history = trainer.state.log_history
    metric = REWARD_METRICS[method]
    curve = _curve(history, metric)
    thinking = getattr(args, "chat_template_kwargs", None) or chat_template_kwargs()
    card = {
        "method": method, "role": role or target.name, "base": base_reference(source),
        "init_adapter": recipe.init_adapter,
        "thinking": bool(thinking.get("enable_thinking", False)),
        "data": data, "data_size": len(trainer.train_dataset),
        "steps": int(result.global_step), "train_loss": float(result.training_loss),
        "reward_metric": metric, **curve,
        **(summary(trainer) if summary else {}),
        "seconds": round(time.monotonic() - started, 3),
        "recipe": recipe.record(args),
    }
    if trainer.accelerator.is_main_process:  # one writer under accelerate launch
        save_adapter(trainer.accelerator.unwrap_model(trainer.model), tokenizer, target, card, readme=model_card(card))
    trainer.accelerator.wait_for_everyone()
    logger.info("%s adapter %s saved to %s (%d steps, %s %s -> %s, %.1f s)", method, card["role"], target,
                card["steps"], metric, curve["reward_first"], curve["reward_last"], card["seconds"])
    return LoraRun(out=target, base=base, role=card["role"], method=method, data_size=card["data_size"],
                   steps=card["steps"], train_loss=card["train_loss"], rewards=curve["rewards"],
                   reward_first=curve["reward_first"], reward_last=curve["reward_last"], card=card,
                   seconds=card["seconds"])


def fit_grpo(
    dataset: Dataset,
    *,
    base: str,
    name: str,
    out: str | Path,
    reward_funcs: Mapping[str, tuple[RewardFunction, float]] | Sequence[RewardFunction],
    config: LoraRecipe,
    callbacks: Sequence[TrainerCallback] = (),
    error: type[Exception],
    data: str | None = None,
    rollout_func: Callable[[list[Any], Any], dict[str, Any]] | None = None,
) -> LoraRun:
    """One GRPO run of ``fit_lora`` on a prompt dataset, the adapter saved to ``out/<name>``;
    the speakers' and the Director's.

    Args:
        dataset: Rows with a ``prompt`` column (conversational or plain), and any columns
            the reward functions read.
        base: A local model directory or a cached Hub id.
        name: The adapter's folder name under ``out``.
        out: The adapters folder; checkpoints go to ``out/checkpoints/<name>``.
        reward_funcs: Name -> (function, weight), see ``rewards.weighted_rewards``; or a
            list of functions weighed by ``training.reward_weights``.
        config: The role's GRPO recipe.
        callbacks: ``transformers`` trainer callbacks.
        error: The caller's one-line error class (``SpeakerTrainingError`` for the speakers).
        data: What the prompts came from, for the card.
        rollout_func: TRL's, e.g. ``DirectorRollout``: generation off the trainer's process.

    Raises:
        error: on an empty dataset or no chat template for conversational prompts.
        AdapterFolderError: on an unusable ``out``.
    """
    if len(dataset) == 0 or "prompt" not in dataset.column_names:
        raise error(f"the dataset needs rows with a 'prompt' column; got {len(dataset)} rows, "
                                   f"columns {', '.join(dataset.column_names) or 'none'}")
    target = adapter_target(out, name)
    if isinstance(reward_funcs, Mapping):
        functions, weights = weighted_rewards(reward_funcs)
    else:
        functions, weights = list(reward_funcs), None

    def build(model: Any, tokenizer: Any, args: Any) -> GRPOTrainer:
        if weights is not None:
            args.reward_weights = weights
        return GRPOTrainer(model, reward_funcs=functions, args=args, train_dataset=dataset,
                           processing_class=tokenizer, peft_config=config.lora_config(model), callbacks=list(callbacks),
                           rollout_func=rollout_func)

    def summary(trainer: GRPOTrainer) -> dict[str, Any]:
        return {"reward_terms": trainer.reward_func_names,
                "reward_weights": [float(w) for w in trainer.reward_weights]}

    return fit_lora(base=base, target=target, method="grpo", recipe=config, build=build, summary=summary,
                    conversational=isinstance(dataset[0]["prompt"], list), error=error, data=data)


def load_base_model(source: str, method: Method, tokenizer: Any, *, bf16: bool = False) -> Any:
    """The base model a method trains: a causal LM (bf16 or fp32), or for ``reward_model``
    a one-label sequence classifier in fp32 (``tokenizer`` gets a pad token if it has none)."""
    if method != "reward_model":
        return AutoModelForCausalLM.from_pretrained(source, dtype=torch.bfloat16 if bf16 else torch.float32)
    if tokenizer.pad_token is None:  # as TRL does: the head needs a pad token to find the last token
        tokenizer.pad_token = tokenizer.eos_token
    # fp32 as TRL loads it; a causal-LM checkpoint gets a new random `score` head, and TRL's
    # context keeps transformers from reporting that (and the unused `lm_head`) as a problem
    with suppress_seqcls_warning():
        model = AutoModelForSequenceClassification.from_pretrained(source, num_labels=1, dtype=torch.float32)
    model.config.pad_token_id = tokenizer.pad_token_id
    return model


def _with_adapter(model: Any, folder: str, method: Method, error: type[Exception]) -> Any:
    """``model`` with the saved LoRA adapter in ``folder`` on it, trainable: the run goes on
    training that adapter (``trainer(peft_config=None)``) instead of starting a new one."""
    from peft import PeftModel

    if method == "reward_model":
        raise error("init_adapter: a reward model starts from its base (a warm start is for Director and speakers)")
    if not (Path(folder) / "adapter_config.json").is_file():
        raise error(f"init_adapter: no LoRA adapter in {folder} (no adapter_config.json)")
    return PeftModel.from_pretrained(model, folder, is_trainable=True)


def _curve(history: Sequence[Mapping[str, Any]], metric: str, fraction: float = 0.25) -> dict[str, Any]:
    """The logged values of ``metric`` and the means of their first and last ``fraction``."""
    values = [float(entry[metric]) for entry in history if metric in entry]
    window = max(1, int(len(values) * fraction))
    return {"rewards": values,
            "reward_first": sum(values[:window]) / window if values else None,
            "reward_last": sum(values[-window:]) / window if values else None}


def model_card(card: Mapping[str, Any]) -> str:
    """The adapter's Hugging Face ``README.md``: metadata for the Hub, then the card's numbers."""
    method = card["method"]
    what = "a reward model (LoRA adapter and scalar head)" if method == "reward_model" else "a LoRA adapter"
    curve = ", ".join(f"{v:.3f}" for v in card["rewards"][:40]) + (" ..." if len(card["rewards"]) > 40 else "")
    first, last = (("-" if card[k] is None else f"{card[k]:.3f}") for k in ("reward_first", "reward_last"))
    return (
        f"---\nbase_model: {card['base']}\nlibrary_name: peft\ntags:\n- mascot\n- trl\n- {method.replace('_', '-')}\n"
        f"---\n\n# {card['role']} ({method}, mascot)\n\n"
        f"This is {what} for `{card['role']}` on `{card['base']}`, trained with TRL's `{TRAINERS[method]}` "
        f"on {card['data_size']} rows from `{card['data'] or 'memory'}` for {card['steps']} steps. "
        f"Prompts were rendered with thinking {'on' if card['thinking'] else 'off'}.\n\n"
        f"Reward curve (`{card['reward_metric']}` per logging step): {curve or 'not logged'}; "
        f"first quarter {first}, last quarter {last}. Mean loss {card['train_loss']:.4f}.\n\n"
        "Every number and setting is in `adapter_card.json`.\n"
    )
