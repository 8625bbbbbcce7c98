"""Reward models: a sequence-classification head plus LoRA on a small base, trained by TRL.

``train_reward_model`` fits one on preference pairs (TRL's ``RewardTrainer``, Bradley-Terry
loss), measures held-out pairwise accuracy before and after, and saves the adapter, the
head and the tokenizer with the adapter card every trainer writes (``lora_run``).
``RewardModel`` loads it back and scores replies; ``RewardModel.reward_function`` gives a
reward function in TRL's GRPO protocol (``rewards.model_reward``).

A sequence is scored exactly as TRL tokenizes it for training: conversational pairs are the
chat template over ``prompt + chosen`` (no generation prompt), rendered with the variables
every served prompt gets (``mascot.policies.thinking``), plain pairs are
``prompt + reply + eos``; the reward is the head's output at the last token. Messages keep
only ``role`` and ``content`` (the speakers' prompts carry names in the text).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from datasets import Dataset
from peft import PeftModel
from transformers import AutoTokenizer, TrainerCallback
from trl import RewardConfig, RewardTrainer

from mascot.policies.model_source import resolve_model
from mascot.policies.thinking import chat_template_kwargs
from mascot.training.fitting.adapter_folder import CARD_FILE, FORMAT_VERSION
from mascot.training.fitting.lora_run import fit_lora, load_base_model
from mascot.training.fitting.recipe import LoraRecipe
from mascot.training.judging.targets import render_block
from mascot.training.rewards import RewardFunction, model_reward

logger = logging.getLogger(__name__)

#: The base model of the MASCOT recipe.
DEFAULT_BASE = "Qwen/Qwen3-0.6B"
#: The description file of reward models saved before the one adapter card (card format 1).
LEGACY_INFO_FILE = "reward_model.json"

Conversation = Sequence[Mapping[str, Any]]
Prompt = Conversation | str
Completion = Conversation | str


class RewardModelError(ValueError):
    """A reward model cannot be trained, saved or loaded; the message is one line."""


@dataclass
class RewardModelConfig(LoraRecipe):
    """Our knobs for a reward model; TRL's ``RewardConfig`` (``training``) holds the trainer's.

    Attributes:
        lora_r: LoRA rank.
        lora_alpha: LoRA scaling numerator.
        lora_dropout: LoRA dropout (TRL's ``disable_dropout``, on by default, zeroes it).
        lora_target_modules: Module names to adapt, or ``"all-linear"``. The head
            (``score``) is trained fully and saved with the adapter (PEFT's SEQ_CLS task).
        use_margin: Pass the pairs' ``margin`` (1-5 judge units) to TRL's loss,
            ``-log sigmoid(r_chosen - r_rejected - margin)``; off, plain Bradley-Terry.
        score_batch_size: Sequences per forward pass when scoring.
        training: A ``trl.RewardConfig`` used as is, or a mapping of its fields laid over
            CPU-safe defaults (see ``trainer_args``), or ``None`` for the defaults.
    """

    trainer_config: ClassVar[type] = RewardConfig
    subject: ClassVar[str] = "reward-model"
    # PEFT's SEQ_CLS task adds the ``score`` head to modules_to_save
    lora_task: ClassVar[str] = "SEQ_CLS"
    # 8 pairs per optimizer step in micro-batches of 2: a pair is two sequences of up to
    # max_length tokens, and on a real 0.5B model in fp32 a micro-batch of 8 pairs of the
    # speakers' ~1,000-token prompts held ~24 GB of activations for the backward pass
    trainer_defaults: ClassVar[dict[str, Any]] = {
        "per_device_train_batch_size": 2, "gradient_accumulation_steps": 4, "per_device_eval_batch_size": 2,
        "num_train_epochs": 1, "max_length": 1024, "logging_steps": 1,
    }

    use_margin: bool = False
    score_batch_size: int = 16

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.score_batch_size < 1:
            raise ValueError(f"score_batch_size={self.score_batch_size}: must be at least 1")



@dataclass(frozen=True)
class RewardReport:
    """What ``train_reward_model`` did: where it saved the model, the base as given, pairs
    trained on and held out, the fraction of held-out pairs with r(chosen) > r(rejected)
    before and after training (``None`` without test pairs), mean loss, optimizer steps and
    wall time (loading and saving included)."""

    out: Path
    base: str
    train_pairs: int
    test_pairs: int
    accuracy_before: float | None
    accuracy_after: float | None
    train_loss: float
    steps: int
    seconds: float


def train_reward_model(
    train_pairs: Sequence[Mapping[str, Any]],
    test_pairs: Sequence[Mapping[str, Any]],
    *,
    base: str,
    out: str | Path,
    config: RewardModelConfig | Mapping[str, Any] | None = None,
    callbacks: Sequence[TrainerCallback] = (),
) -> RewardReport:
    """Train a LoRA reward model on preference pairs and save it.

    Args:
        train_pairs: Rows with ``prompt``, ``chosen``, ``rejected`` (TRL's preference
            columns, conversational or plain; ``build_pairs`` makes them) and ``margin``
            when ``config.use_margin``.
        test_pairs: Held-out rows of the same shape for the accuracy (may be empty).
        base: A local model directory or a Hub id (cached, or reachable).
        out: The folder to save to. Its parent must exist; an existing reward-model
            folder there is replaced only once the new one is complete. Checkpoints go to
            ``checkpoints/<name>`` beside it, and a rerun resumes from the last.
        config: Our settings, or a recipe mapping for ``RewardModelConfig.from_dict``.
        callbacks: ``transformers`` trainer callbacks (progress, early stopping, ...).

    Returns:
        The report; the same numbers are saved in ``out/adapter_card.json``.

    Raises:
        LocalModelError: if the base model cannot be loaded from anywhere.
        RewardModelError: on no training pairs, a malformed pair, a tokenizer without a
            chat template for conversational pairs, or an unusable ``out``.
    """
    if not isinstance(config, RewardModelConfig):
        config = RewardModelConfig.from_dict(config or {})
    out = _check_out(Path(out).expanduser())
    if not train_pairs:
        raise RewardModelError("no training pairs")
    train_rows = [_row(pair, f"train pair {i}", config.use_margin) for i, pair in enumerate(train_pairs)]
    test_rows = [_row(pair, f"test pair {i}", False) for i, pair in enumerate(test_pairs)]
    if len({isinstance(row["prompt"], str) for row in train_rows}) > 1:
        raise RewardModelError("training pairs mix chat messages and plain text; use one format")
    # RewardConfig has no chat_template_kwargs: TRL renders each row with its own column
    dataset = Dataset.from_list([{**row, "chat_template_kwargs": chat_template_kwargs()} for row in train_rows])
    before: list[float | None] = []

    def build(model: Any, tokenizer: Any, args: Any) -> RewardTrainer:
        trainer = RewardTrainer(model, args, train_dataset=dataset, processing_class=tokenizer,
                                peft_config=config.lora_config(model), callbacks=list(callbacks))
        _check_head_trainable(trainer.model)
        used = len(trainer.train_dataset)  # TRL drops pairs longer than max_length
        if not used:
            raise RewardModelError(f"every training pair exceeds max_length={args.max_length} tokens")
        if used < len(train_rows):
            logger.warning("%d of %d training pairs exceed max_length=%s; not trained on",
                           len(train_rows) - used, len(train_rows), args.max_length)
        trainer.model.eval()  # the trainer switches to train mode itself
        before.append(_accuracy(trainer, config, test_rows))
        return trainer

    def summary(trainer: RewardTrainer) -> dict[str, Any]:
        after = _accuracy(trainer, config, test_rows)
        if test_rows:
            logger.info("held-out pairwise accuracy %.3f -> %.3f (%d pairs)", before[0], after, len(test_rows))
        else:
            logger.warning("no test pairs: accuracy not measured")
        return {"test_pairs": len(test_rows), "accuracy_before": before[0], "accuracy_after": after}

    run = fit_lora(base=base, target=out, method="reward_model", recipe=config, build=build, summary=summary,
                   conversational=isinstance(train_rows[0]["prompt"], list), error=RewardModelError)
    return RewardReport(out=out, base=base, train_pairs=run.data_size, test_pairs=len(test_rows),
                        accuracy_before=run.card["accuracy_before"], accuracy_after=run.card["accuracy_after"],
                        train_loss=run.train_loss, steps=run.steps, seconds=run.seconds)


def _accuracy(trainer: Any, config: RewardModelConfig, rows: Sequence[Mapping[str, Any]]) -> float | None:
    """Held-out pairwise accuracy of the trainer's model (``None`` without rows)."""
    if not rows:
        return None
    trainer.model.eval()
    return RewardModel(trainer.model, trainer.processing_class, batch_size=config.score_batch_size).accuracy(rows)


def _check_out(out: Path) -> Path:
    if not out.parent.is_dir():
        raise RewardModelError(f"directory of {out} does not exist")
    if out.exists() and not out.is_dir():
        raise RewardModelError(f"{out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not any((out / f).is_file() for f in (CARD_FILE, LEGACY_INFO_FILE)):
        raise RewardModelError(f"{out} holds something other than a reward model; not replacing it")
    return out


def _row(pair: Mapping[str, Any], where: str, with_margin: bool) -> dict[str, Any]:
    """One dataset row in TRL's explicit-prompt preference format."""
    needed = ("prompt", "chosen", "rejected", "margin") if with_margin else ("prompt", "chosen", "rejected")
    missing = [key for key in needed if key not in pair]
    if missing:
        raise RewardModelError(f"{where}: missing {', '.join(missing)}")
    row = {key: _normalized(pair[key], f"{where}.{key}") for key in ("prompt", "chosen", "rejected")}
    if isinstance(row["prompt"], str) != isinstance(row["chosen"], str):
        raise RewardModelError(f"{where}: prompt and replies must both be messages or both be text")
    if with_margin:
        row["margin"] = float(pair["margin"])
    return row


def _normalized(value: Any, where: str) -> list[dict[str, str]] | str:
    if isinstance(value, str):
        return value
    if not isinstance(value, Sequence) or not value:
        raise RewardModelError(f"{where}: expected text or a non-empty list of messages")
    messages = []
    for message in value:
        if not (isinstance(message, Mapping) and "role" in message and isinstance(message.get("content"), str)):
            raise RewardModelError(f"{where}: every message needs a 'role' and a text 'content'")
        content = message["content"]
        if message.get("role") == "assistant" and message.get("name"):  # who said what, for a group RM
            content = f"{message['name']}: {content}"
        messages.append({"role": str(message["role"]), "content": content})
    return messages


def _read_card(path: Path) -> dict[str, Any]:
    """A reward model's card (or the description file of one saved before the common card).

    Raises:
        RewardModelError: if ``path`` holds no reward model, or one of a newer format.
    """
    card_path = path / CARD_FILE
    if not card_path.is_file() and (path / LEGACY_INFO_FILE).is_file():
        card_path = path / LEGACY_INFO_FILE
    if not card_path.is_file():
        raise RewardModelError(f"{path} is not a reward model ({CARD_FILE} missing)")
    try:
        card = json.loads(card_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise RewardModelError(f"{card_path}: unreadable card ({exc})") from None
    if not isinstance(card, dict) or "base" not in card:
        raise RewardModelError(f"{card_path}: no base model in the card")
    if card.get("method", "reward_model") != "reward_model":
        raise RewardModelError(f"{path} is not a reward model but a {card['method']} adapter")
    if card.get("format", 0) > FORMAT_VERSION:
        raise RewardModelError(f"{path} was saved by a newer mascot (format {card['format']}); upgrade mascot")
    return card


def _check_head_trainable(model: Any) -> None:
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    if not any(".modules_to_save." in name for name in trainable):
        raise RewardModelError(
            f"the classification head of {type(model.base_model.model).__name__} is not trainable "
            "(PEFT knows heads named 'score' or 'classifier')"
        )


class RewardModel:
    """A reward model in memory: base + adapter + head, and its tokenizer."""

    def __init__(
        self, model: Any, tokenizer: Any, *, batch_size: int = 16, info: Mapping[str, Any] | None = None
    ) -> None:
        """Wrap a one-label sequence-classifier (PEFT or not) and its tokenizer (pad token set);
        ``load`` loads a saved one. ``info`` is its adapter card."""
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.info = dict(info or {})

    @classmethod
    def load(cls, path: str | Path, *, base: str | None = None, device: str | None = None) -> RewardModel:
        """Load a reward model saved by ``train_reward_model``.

        Args:
            path: The saved folder.
            base: Where the base model is now, if not where it was when trained.
            device: ``cuda``, ``cpu``, ...; by default the GPU when there is one.

        Raises:
            RewardModelError: if ``path`` is not a saved reward model.
            LocalModelError: if the base model cannot be loaded.
        """
        path = Path(path).expanduser()
        card = _read_card(path)
        source = resolve_model(base or card["base"])
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        model = PeftModel.from_pretrained(load_base_model(source, "reward_model", tokenizer), str(path))
        model.eval()
        model.to(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        settings = card.get("recipe", card.get("lora", {}))  # format 1 kept our settings under "lora"
        batch_size = settings.get("score_batch_size", 16)
        logger.info("reward model %s loaded on %s", path, source)
        return cls(model, tokenizer, batch_size=batch_size, info=card)

    def score(self, prompts: Sequence[Prompt], replies: Sequence[Completion]) -> list[float]:
        """Score replies to prompts, in batches.

        Args:
            prompts: Chat messages or plain text, one per reply.
            replies: Reply text, or messages to append (a conversational completion).

        Returns:
            One reward per reply, in order.

        Raises:
            ValueError: if the lengths differ or a plain-text prompt gets messages.
        """
        if len(prompts) != len(replies):
            raise ValueError(f"{len(prompts)} prompts but {len(replies)} replies")
        sequences = [self._encode(p, r) for p, r in zip(prompts, replies, strict=True)]
        order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))  # less padding
        rewards = [0.0] * len(sequences)
        device = next(self.model.parameters()).device
        with torch.inference_mode():
            for start in range(0, len(order), self.batch_size):
                chunk = order[start : start + self.batch_size]
                ids, mask = _pad([sequences[i] for i in chunk], self.tokenizer.pad_token_id)
                logits = self.model(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False).logits
                for i, value in zip(chunk, logits[:, 0].float().tolist(), strict=True):
                    rewards[i] = value
        return rewards

    def score_blocks(self, contexts: Sequence[Prompt], blocks: Sequence[Conversation | str]) -> list[float]:
        """Score blocks of turns for a group reward model: each block is one reply, turns
        (messages with ``name``) rendered by ``render_block``, after its context (messages or
        text). Returns one reward per block."""
        return self.score(contexts, [b if isinstance(b, str) else render_block(b) for b in blocks])

    def accuracy(self, pairs: Sequence[Mapping[str, Any]]) -> float:
        """Fraction of pairs with r(chosen) > r(rejected) (ties count as wrong).

        Raises:
            RewardModelError: on no pairs or a malformed pair.
        """
        if not pairs:
            raise RewardModelError("no pairs to measure accuracy on")
        rows = [_row(pair, f"pair {i}", False) for i, pair in enumerate(pairs)]
        prompts = [row["prompt"] for row in rows]
        rewards = self.score(prompts * 2, [row["chosen"] for row in rows] + [row["rejected"] for row in rows])
        return sum(c > r for c, r in zip(rewards[: len(rows)], rewards[len(rows) :], strict=True)) / len(rows)

    def reward_function(self, name: str = "reward_model") -> RewardFunction:
        """A reward function in TRL's GRPO protocol, ``(prompts, completions, **kwargs)``,
        named ``name`` (TRL logs the reward under its ``__name__``): ``rewards.model_reward``
        of this model."""
        return model_reward(self, name)

    def _encode(self, prompt: Prompt, reply: Completion) -> list[int]:
        """Token ids of one sequence, as TRL's RewardTrainer tokenizes it."""
        if isinstance(prompt, str):
            if not isinstance(reply, str):
                raise ValueError("a plain-text prompt needs a plain-text reply")
            text = prompt + reply
            if not text.endswith(self.tokenizer.eos_token):
                text += self.tokenizer.eos_token
            return list(self.tokenizer(text=text)["input_ids"])
        completion = [{"role": "assistant", "content": reply}] if isinstance(reply, str) else reply
        messages = _normalized(list(prompt) + list(completion), "messages")
        encoded = self.tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True,
                                                     **chat_template_kwargs())
        return list(encoded["input_ids"])


def _pad(sequences: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad like TRL's collator (the head reads the last non-pad token)."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, sequence in enumerate(sequences):
        ids[i, : len(sequence)] = torch.tensor(sequence, dtype=torch.long)
        mask[i, : len(sequence)] = 1
    return ids, mask
