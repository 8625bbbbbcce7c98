from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from langchain_core.messages import HumanMessage, SystemMessage

from mascot.policies import Policies
from mascot.policies.local import LocalBackend, LocalChatModel, LocalModelError

CONVERSATION = [{"role": "user", "content": "I failed my driving test again"}]


def test_two_adapters_in_one_batch_differ(tiny_model: Path) -> None:
    backend = LocalBackend.load(
        str(tiny_model),
        adapters={"anchor": tiny_model / "adapters/anchor", "catalyst": tiny_model / "adapters/catalyst"},
        adapter_versions={"anchor": "v1"},
    )
    batch = backend.generate([CONVERSATION] * 3, adapters=["anchor", "catalyst", None], temperature=0,
                             max_new_tokens=12)
    texts = [g.text for g in batch]
    assert len(set(texts)) == 3, texts
    # per-row adapters in a batch give the same result as one row at a time
    alone = backend.generate([CONVERSATION], adapters=["catalyst"], temperature=0, max_new_tokens=12)
    assert alone[0].text == texts[1]
    assert all(g.completion_tokens == 12 and g.prompt_tokens > 5 for g in batch)
    with pytest.raises(ValueError, match="unknown adapter beacon; loaded: anchor, catalyst"):
        backend.generate([CONVERSATION], adapters=["beacon"])


def test_chat_model_sync_async_stream(tiny_model: Path) -> None:
    import asyncio

    backend = LocalBackend.load(str(tiny_model), adapters={"beacon": tiny_model / "adapters/beacon"},
                                adapter_versions={"beacon": "tiny-1"})
    model = LocalChatModel(backend=backend, adapter="beacon", temperature=0, max_new_tokens=10)
    messages = [SystemMessage("You are The Beacon."), HumanMessage("hello")]
    reply = model.invoke(messages)
    assert reply.text and reply.usage_metadata["output_tokens"] <= 10
    assert reply.response_metadata == {"model_name": str(tiny_model), "adapter": "beacon", "adapter_version": "tiny-1"}
    assert asyncio.run(model.ainvoke(messages)).text == reply.text
    pieces = [chunk.text for chunk in model.stream(messages)]
    assert len([p for p in pieces if p]) >= 2 and "".join(pieces) == reply.text


def test_sampling_is_seeded(tiny_model: Path) -> None:
    backend = LocalBackend.load(str(tiny_model))
    def run(seed):
        return backend.generate([CONVERSATION], temperature=1.0, seed=seed, max_new_tokens=16)[0].text
    assert run(1) == run(1)
    assert run(1) != run(2)


def test_llama_architecture(tiny_llama: Path) -> None:
    backend = LocalBackend.load(str(tiny_llama))
    assert backend.model.config.model_type == "llama"
    assert backend.generate([CONVERSATION], max_new_tokens=5)[0].completion_tokens == 5


def test_policies_share_one_base(tiny_model: Path, roster) -> None:
    policies = Policies.from_file(tiny_model / "policies.yaml", roster)
    speakers = policies.speakers()
    backends = {id(m.backend) for m in speakers.values()}
    assert len(backends) == 1
    assert {m.adapter for m in speakers.values()} == set(roster.persona_ids)
    assert policies.chat_model("director").adapter is None
    assert isinstance(next(iter(speakers.values())).backend.model.base_model, torch.nn.Module)
    bare = policies.without_adapters()  # the baselines' policies: the same weights, adapters off
    assert bare.chat_model("anchor").adapter is None and bare.record("anchor")["adapter"] is None
    assert bare.chat_model("anchor").backend is speakers["anchor"].backend


def test_missing_model_fails_fast_with_the_fix(tmp_path: Path) -> None:
    start = time.monotonic()
    with pytest.raises(LocalModelError, match="HF_HUB_OFFLINE is set; pass a local model directory"):
        LocalBackend.load("someone/not-a-cached-model")
    with pytest.raises(LocalModelError, match="no model directory at"):
        LocalBackend.load(str(tmp_path / "missing"))
    with pytest.raises(LocalModelError, match="config.json missing"):
        LocalBackend.load(str(tmp_path))
    assert time.monotonic() - start < 5


def test_seed_varies_with_episode_and_sample_metadata(tiny_model: Path) -> None:
    backend = LocalBackend.load(str(tiny_model))
    model = LocalChatModel(backend=backend, temperature=1.0, max_new_tokens=12, seed=7)

    def reply(**metadata: object) -> str:
        return model.invoke([HumanMessage("tell me something")], {"metadata": metadata}).text

    assert reply(episode_id="a") == reply(episode_id="a")  # reproducible per episode
    assert len({reply(episode_id="a"), reply(episode_id="b"), reply(episode_id="a", sample=1)}) == 3
    assert reply() == reply()  # without metadata: the model's own seed
