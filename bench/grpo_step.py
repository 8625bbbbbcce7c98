"""Speaker GRPO steps with the `speakers-qwen3` recipe: seconds per step and peak memory.

Runs the shipped recipe (LoRA r=16 on q/k/v/o, groups of 8, bf16 on a GPU) on a
random-weight model with Qwen3-0.6B's shape (28 layers, hidden 1024, 16/8 heads; the
vocabulary is the offline tokenizer's, so the embedding is smaller than the real one's),
twice side by side: as shipped (activation checkpointing on) and with it off, and prints
the ratios. Nothing is downloaded; the prompts are the persona turns of scripted episodes.

    python bench/grpo_step.py                 # on a GPU: Qwen3-0.6B shape
    python bench/grpo_step.py --shape tiny    # anywhere: the test model's shape
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from transformers import AutoModelForCausalLM, GenerationConfig, Qwen3Config, TrainerCallback

from mascot.graphs import create_director_graph
from mascot.rosters import load_roster, load_scenarios
from mascot.testing.tiny_model import build_tokenizer
from mascot.training.episodes.episode import read_episodes
from mascot.training.episodes.rollout import collect_episodes
from mascot.training.fitting.recipe import recipe_path
from mascot.training.fitting.speaker_training import SpeakerTrainingConfig, speaker_prompts, train_speaker

SHAPES = {
    "qwen3-0.6b": {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
                   "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128},
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16},
}


class StepClock(TrainerCallback):
    """Wall time of every optimizer step."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.start = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.times.append(time.perf_counter() - self.start)


def build_model(out: Path, shape: str) -> Path:
    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(out)
    special = {"vocab_size": len(tokenizer), "bos_token_id": tokenizer.convert_tokens_to_ids("<|endoftext|>"),
               "eos_token_id": tokenizer.convert_tokens_to_ids("<|im_end|>"),
               "pad_token_id": tokenizer.convert_tokens_to_ids("<|pad|>")}
    torch.manual_seed(0)
    config = Qwen3Config(**SHAPES[shape], **special, max_position_embeddings=8192, tie_word_embeddings=True)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config = GenerationConfig(eos_token_id=special["eos_token_id"],
                                               pad_token_id=special["pad_token_id"])
    model.save_pretrained(out)
    return out


def episodes(out: Path) -> list:
    roster = load_roster("emotional_support")
    director = FakeListChatModel(responses=[json.dumps({"speaker": p, "action": "respond", "tone": "warm"})
                                            for p in roster.persona_ids] * 50)
    voice = FakeListChatModel(responses=["I hear you; that sounds hard. What would help most tonight?"] * 400)
    graph = create_director_graph(roster, director=director, speakers=voice, user=voice, max_rounds=3)
    asyncio.run(collect_episodes(graph, load_scenarios(roster.id)[:4], roster.user_profiles[:2],
                                 roster=roster.id, out=out / "episodes.jsonl"))
    return read_episodes(out / "episodes.jsonl")


def short_replies(prompts: list, completions: list, completion_ids: list, **kwargs: Any) -> list[float | None]:
    """A learnable stand-in for the persona RM: replies near 40 tokens score highest."""
    return [-abs(len(ids) - 40) / 40 for ids in completion_ids]


def run(base: Path, work: Path, *, steps: int, checkpointing: bool) -> dict[str, float]:
    config, _ = SpeakerTrainingConfig.parse(recipe_path("speakers-qwen3"), [
        "--max_steps", str(steps), "--rm_weight", "0", "--gradient_accumulation_steps", "1",
        "--save_strategy", "no", "--activation_checkpointing", str(checkpointing).lower(),
        "--disable_tqdm", "true", "--logging_steps", "1",
        *([] if torch.cuda.is_available() else ["--bf16", "false", "--use_cpu", "true"])])
    roster = load_roster("emotional_support")
    dataset = speaker_prompts(episodes(work), roster, "anchor")
    clock = StepClock()
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    terms = {**config.reward_terms(roster, "anchor"), "short_replies": (short_replies, 1.0)}
    report = train_speaker(dataset, base=str(base), persona="anchor", out=work / f"adapters-{checkpointing}",
                           reward_funcs=terms, config=config, callbacks=[clock])
    warm = clock.times[1:] or clock.times
    return {"prompts": len(dataset), "steps": report.steps, "s_per_step": sum(warm) / len(warm),
            "first_step_s": clock.times[0],
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else float("nan"),
            "reward_first": report.reward_first, "reward_last": report.reward_last}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=SHAPES, default="qwen3-0.6b" if torch.cuda.is_available() else "tiny")
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        base = build_model(work / "model", args.shape)
        device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
        print(f"speakers-qwen3 recipe, {args.shape} shape, {args.steps} steps, on {device}")
        results = {on: run(base, work, steps=args.steps, checkpointing=on) for on in (True, False)}
    for on, r in results.items():
        print(f"activation checkpointing {'on ' if on else 'off'}: {r['s_per_step']:.2f} s/step "
              f"(first {r['first_step_s']:.2f} s), peak {r['peak_gib']:.1f} GiB, {r['prompts']} prompts, "
              f"reward {r['reward_first']:.3f} -> {r['reward_last']:.3f}")
    on, off = results[True], results[False]
    print(f"ratio on/off: time {on['s_per_step'] / off['s_per_step']:.2f}x, "
          f"memory {on['peak_gib'] / off['peak_gib']:.2f}x")


if __name__ == "__main__":
    main()
