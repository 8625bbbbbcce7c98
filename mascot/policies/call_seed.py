"""The seed of one model call: the run's seed mixed with where in the run the call is made.

A rollout, a candidate sample or a judge pass gives every call the same ``seed``; sent as is,
every call would draw the same random numbers, and a small model whose distribution barely
moves with the persona prompt would then give every voice the same reply. Each call instead
gets ``seed`` mixed with the run metadata that tells calls apart (the episode, the sample,
LangGraph's node and step) and the adapter: reproducible for the same call, different for
different ones, whatever order concurrent calls run in. The local backend seeds its sampler
with it; OpenAI-compatible servers (vLLM, ``mascot serve``) get it as the request's ``seed``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

#: Run metadata that varies the seed: rollouts and candidates set the first two, LangGraph the others.
SEED_METADATA = ("episode_id", "sample", "langgraph_node", "langgraph_step")


def call_seed(seed: int | None, metadata: Mapping[str, Any] | None, adapter: str | None) -> int | None:
    """``seed`` mixed with the call's ``SEED_METADATA`` and adapter (a 63-bit integer, which
    every server's ``seed`` field takes); ``None`` when ``seed`` is ``None``."""
    if seed is None:
        return None
    metadata = metadata or {}
    key = "|".join(str(part) for part in [seed, *(metadata.get(name) for name in SEED_METADATA), adapter])
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") >> 1
