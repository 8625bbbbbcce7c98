"""Director GRPO's rollout on a vLLM server: the sampled directions and the blocks they lead to, made together.

TRL's ``GRPOTrainer(rollout_func=...)`` hands the rollout a batch of Director prompts (each
repeated ``num_generations`` times, consecutively) and takes back the token ids of every
prompt and completion with their log-probabilities. ``DirectorRollout`` does that on the
vLLM server that already plays the blocks' speakers:

1. **sync**: at each new optimizer step the trainer's adapter is saved to a new folder
   (vLLM keys its prefix cache by adapter name and path) and loaded in place under one name
   (``load_inplace``); the two newest folders are kept;
2. **directions**: one chat completion per distinct prompt with ``n`` samples,
   ``logprobs`` and ``return_token_ids`` (every sampling field is sent: a field left out
   takes the model's generation defaults), so the server's prefix cache shares the prompt
   among its samples;
3. **blocks**: each direction is played for ``block_turns`` turns by ``BlockRollout`` with the
   current speakers, and the blocks go back to TRL as the ``block`` column, which the reward
   terms of ``DirectorRewards`` read instead of playing anything themselves.

Generation then leaves the trainer's process: it only runs forward and backward passes,
and its memory stays flat under an allocator that keeps freed pages
(``mascot.policies.allocator``).
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from mascot.policies.serving import ServedAdapter
from mascot.policies.spec import PolicyError
from mascot.policies.vllm import load_adapters
from mascot.training.data.block_rollout import BlockRollout, DecisionPoint

logger = logging.getLogger(__name__)

#: Name the trained adapter is served under while it trains.
ADAPTER_NAME = "director-grpo"


@dataclass(frozen=True)
class DirectionSampling:
    """What every direction request sends: TRL's sampling settings, all of them explicit."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0

    @classmethod
    def from_trainer(cls, args: Any) -> DirectionSampling:
        """The settings of a ``trl.GRPOConfig`` (``top_k`` 0 or ``None`` means off)."""
        return cls(max_tokens=int(args.max_completion_length), temperature=float(args.temperature),
                   top_p=float(args.top_p), top_k=int(args.top_k or -1), min_p=float(args.min_p or 0.0),
                   repetition_penalty=float(args.repetition_penalty))


class DirectorRollout:
    """TRL's ``rollout_func`` for Director GRPO on a vLLM server (see the module docstring)."""

    def __init__(
        self,
        points: Sequence[DecisionPoint],
        blocks: BlockRollout,
        *,
        url: str,
        served_name: str,
        adapters_dir: str | Path,
        sampling: DirectionSampling | None = None,
        concurrency: int = 8,
        client: httpx.Client | None = None,
        load: Any = None,
    ) -> None:
        """Args:
            points: The decision points of the dataset (found by their prompt).
            blocks: Plays the directions with the current speakers.
            url: The vLLM server's ``.../v1`` URL (runtime LoRA allowed).
            served_name: The base model's name on that server (the trainer's base).
            adapters_dir: Where each step's adapter is saved for the server.
            sampling: The requests' sampling; default from the trainer's config at the first call.
            concurrency: Prompts requested at once.
            client: HTTP client (tests); default a new one.
            load: ``(url, [ServedAdapter]) -> None`` that loads an adapter (tests); default
                ``vllm.load_adapters``.
        """
        self.points = {_key(p.prompt): p for p in points}
        self.blocks = blocks
        self.url = url.rstrip("/")
        self.served_name = served_name
        self.adapters_dir = Path(adapters_dir)
        self.sampling = sampling
        self.concurrency = concurrency
        self.client = client or httpx.Client(timeout=600.0)
        self._load = load or load_adapters
        self._synced_step: int | None = None
        self._saved: list[Path] = []

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        """Sample one direction per prompt (rows of the same prompt together), play each one's
        block; the token ids, log-probabilities and blocks of the batch.

        Raises:
            PolicyError: if the server refuses a request or the adapter (one line, with its reason).
            ValueError: on a prompt that is no decision point of the dataset.
        """
        if self.sampling is None:
            self.sampling = DirectionSampling.from_trainer(trainer.args)
        model = self._sync(trainer)
        groups: list[tuple[Any, int]] = []
        for prompt in prompts:
            if groups and groups[-1][0] == prompt:
                groups[-1] = (prompt, groups[-1][1] + 1)
            else:
                groups.append((prompt, 1))
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            answers = list(pool.map(lambda group: self._complete(model, *group), groups))
        prompt_ids, completion_ids, logprobs, texts, points = [], [], [], [], []
        for (prompt, count), (ids, choices) in zip(groups, answers, strict=True):
            point = self.points.get(_key(prompt))
            if point is None:
                raise ValueError("a Director GRPO prompt is not among the decision points")
            for choice in choices[:count]:
                prompt_ids.append(list(ids))
                completion_ids.append(list(choice["token_ids"]))
                logprobs.append([float(t["logprob"]) for t in (choice.get("logprobs") or {}).get("content") or []])
                texts.append(choice["message"].get("content") or "")
                points.append(point)
        played = self.blocks.run(points, texts)
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs, "block": played}

    def _complete(self, model: str, prompt: Any, n: int) -> tuple[list[int], list[dict[str, Any]]]:
        """``n`` sampled completions of one prompt: the prompt's token ids and the choices."""
        sampling = self.sampling
        assert sampling is not None  # set by __call__
        body = {"model": model, "messages": list(prompt), "n": n, "max_tokens": sampling.max_tokens,
                "temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k,
                "min_p": sampling.min_p, "repetition_penalty": sampling.repetition_penalty,
                "logprobs": True, "return_token_ids": True, "skip_special_tokens": True,
                "chat_template_kwargs": {"enable_thinking": False}}
        try:
            answer = self.client.post(f"{self.url}/chat/completions", json=body)
        except httpx.HTTPError as exc:
            raise PolicyError(f"cannot reach the vLLM server at {self.url}: {exc}") from None
        if answer.status_code != 200:
            raise PolicyError(f"vLLM at {self.url} refused a Director sample: {answer.status_code} "
                              f"{answer.text.strip()[:300]}")
        data = answer.json()
        choices = sorted(data.get("choices") or [], key=lambda c: c.get("index", 0))
        if len(choices) < n or data.get("prompt_token_ids") is None or any(c.get("token_ids") is None for c in choices):
            raise PolicyError(f"vLLM at {self.url} gave {len(choices)} of {n} samples without token ids "
                              "(return_token_ids needs vLLM 0.10.2 or later)")
        return data["prompt_token_ids"], choices

    def _sync(self, trainer: Any) -> str:
        """The adapter of the trainer's current weights on the server (saved and loaded once
        per optimizer step); its served name."""
        step = int(trainer.state.global_step)
        if self._synced_step != step:
            folder = self.adapters_dir / f"step-{step}"
            if folder.exists():  # a resumed run saves that step again
                shutil.rmtree(folder)
            trainer.model.save_pretrained(str(folder))
            self._load(self.url, [ServedAdapter(name=ADAPTER_NAME, path=folder.resolve(), version=str(step),
                                                      roles=("director",))])
            self._saved.append(folder)
            for old in self._saved[:-2]:
                shutil.rmtree(old, ignore_errors=True)
            self._saved = self._saved[-2:]
            self._synced_step = step
            logger.debug("director adapter of step %d served as %s", step, ADAPTER_NAME)
        return ADAPTER_NAME


def _key(prompt: Any) -> str:
    return json.dumps([{"role": m["role"], "content": m["content"]} for m in prompt], sort_keys=True)
