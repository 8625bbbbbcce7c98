"""A tiny random-weight chat model built offline in seconds, for tests, CI and dry runs.

Needs the ``train`` extra (torch, transformers, tokenizers, peft).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Literal

import torch
import yaml
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    GenerationConfig,
    LlamaConfig,
    PreTrainedTokenizerFast,
    Qwen3Config,
)

from mascot.policies.local.model_loading import quiet_loading
from mascot.rosters import Roster, list_rosters, load_roster, load_scenarios

logger = logging.getLogger(__name__)

ARCHITECTURES = ("qwen3", "llama")
#: The policy file written beside the model (``DIR/policies.yaml``).
POLICY_FILE = "policies.yaml"
#: ChatML with Qwen3's thinking switch. As in Qwen3's template, an assistant reply that ends
#: the conversation after the last user message opens with an empty think block, and so
#: does the generation prompt when ``enable_thinking`` is false; then a prompt rendered
#: alone is a prefix of the same prompt rendered with its reply.
CHAT_TEMPLATE = (
    "{% set ns = namespace(last_query=messages|length - 1, found=false) %}"
    "{% for message in messages[::-1] %}{% if not ns.found and message['role'] == 'user' %}"
    "{% set ns.found = true %}{% set ns.last_query = messages|length - 1 - loop.index0 %}{% endif %}{% endfor %}"
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['role'] == 'assistant' and loop.last and loop.index0 > ns.last_query %}"
    "<think>\n\n</think>\n\n{% endif %}"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
    "{% endif %}"
)
_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
#: Qwen3's think markers: one token each, but not special, so decoding keeps them as text.
_THINK = ["<think>", "</think>"]
_VOCAB_SIZE = 2048
_SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
}
_GENERIC = [
    'The Director answers with JSON: {"speaker": "anchor", "action": "ask", "tone": "warm"}.',
    "I hear you. That sounds hard. What would help most right now? Let us plan one small step.",
    "The meeting agreed to ship on Friday; open questions: budget, owners, risks and timeline.",
    "Yesterday I failed my exam again, and I am tired, angry, hopeful, anxious and curious.",
    "0123456789 ,.;:!?()[]{}<>'\"-_/\\@#$%&*+= abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ",
]


def build_tiny_model(
    out: str | Path,
    *,
    arch: Literal["qwen3", "llama"] = "qwen3",
    with_adapters: bool = False,
    roster: str | Roster = "emotional_support",
    seed: int = 0,
) -> Path:
    """Build and save a tiny random-weight causal LM with a trained tokenizer.

    The tokenizer is a byte-level BPE trained on the shipped rosters' text, with a
    ChatML chat template with Qwen3's ``enable_thinking`` switch (``<think>`` and ``</think>``
    are tokens of their own), a pad token distinct from EOS, and left padding.

    Args:
        out: Output directory (created; existing model files are overwritten).
        arch: ``qwen3`` (default) or ``llama``.
        with_adapters: Also save one LoRA adapter per persona of ``roster`` under
            ``out/adapters/<persona id>``, initialised to non-zero weights so that each
            changes the output, and map the personas to them in ``policies.yaml``.
        roster: The roster whose personas get adapters.
        seed: Seed of the random weights.

    Returns:
        The output directory. It always holds ``policies.yaml``, a policy file with the
        model for every role (``Policies.from_file(out / "policies.yaml", roster)``).

    Raises:
        ValueError: on an unknown architecture.
    """
    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown architecture '{arch}'; valid: {', '.join(ARCHITECTURES)}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(out)
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in _SPECIAL}
    special = {
        "vocab_size": len(tokenizer),
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|pad|>"],
    }
    config_class = Qwen3Config if arch == "qwen3" else LlamaConfig
    config = config_class(**_SHAPE, **special)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config = GenerationConfig(
        eos_token_id=special["eos_token_id"], pad_token_id=special["pad_token_id"]
    )
    with quiet_loading():
        model.save_pretrained(out)
    roles: dict[str, dict[str, str]] = {"default": {}}
    if with_adapters:
        roster = roster if isinstance(roster, Roster) else load_roster(roster)
        _save_adapters(model, roster, out, seed=seed)
        roles.update({pid: {"adapter": f"adapters/{pid}", "version": "tiny-1"} for pid in roster.persona_ids})
    policies = {"version": 1, "defaults": {"kind": "local", "model": "."}, "roles": roles}
    (out / POLICY_FILE).write_text(yaml.safe_dump(policies, sort_keys=False), encoding="utf-8")
    logger.info("tiny %s model written to %s", arch, out)
    return out


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on the shipped rosters and wrap it for chat."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_VOCAB_SIZE,
        special_tokens=_SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(), trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        padding_side="left",
    )
    wrapped.add_tokens([AddedToken(t, special=False, normalized=False) for t in _THINK])
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


def _corpus() -> list[str]:
    texts = list(_GENERIC)
    for roster_id in list_rosters():
        roster = load_roster(roster_id)
        # not the safety rules' examples: the detector's data grows, and the tiny model never reads it
        texts.append(roster.model_dump_json(exclude={"safety"}))
        texts.extend(s.opening + " " + s.context for s in load_scenarios(roster_id))
    return texts


def _save_adapters(model: torch.nn.Module, roster: Roster, out: Path, *, seed: int) -> None:
    from peft import LoraConfig, get_peft_model  # the adapters are optional

    config = LoraConfig(
        r=8,
        lora_alpha=16,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
        init_lora_weights=False,  # random, non-zero: each adapter changes the output
        task_type="CAUSAL_LM",
    )
    torch.manual_seed(seed + 1)
    ids = roster.persona_ids
    with quiet_loading():
        peft_model = get_peft_model(model, config, adapter_name=ids[0])
        for persona_id in ids[1:]:
            peft_model.add_adapter(persona_id, config)
        peft_model.save_pretrained(out / "adapters")

