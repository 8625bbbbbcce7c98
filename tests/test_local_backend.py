from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch
from langchain_core.messages import HumanMessage, SystemMessage

from mascot.policies import Policies
from mascot.policies.local import LocalBackend, LocalModelError
from mascot.policies.local.chat_model import LocalChatModel

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


def test_seed_varies_with_the_graph_node_the_step_and_the_adapter(tiny_model: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from typing import TypedDict

    from langgraph.graph import START, StateGraph

    backend = personas_backend(tiny_model)
    seeds: list[int] = []
    generate = backend.generate
    monkeypatch.setattr(backend, "generate", lambda *a, **k: seeds.append(k["seed"]) or generate(*a, **k))
    model = LocalChatModel(backend=backend, temperature=1.0, max_new_tokens=8, seed=7)

    class State(TypedDict):
        replies: list[str]

    def speak(state: State) -> State:
        return {"replies": [*state["replies"], model.invoke([HumanMessage("tell me something")]).text]}

    graph = StateGraph(State)
    graph.add_node("first", speak)
    graph.add_node("second", speak)
    graph.add_edge(START, "first")
    graph.add_edge("first", "second")
    app = graph.compile()

    def run() -> tuple[list[str], list[int]]:
        seeds.clear()
        return app.invoke({"replies": []}, {"metadata": {"episode_id": "e1"}})["replies"], list(seeds)

    replies, first_seeds = run()
    assert len(set(first_seeds)) == 2 and replies[0] != replies[1]  # two nodes, two random streams
    assert run() == (replies, first_seeds)  # a rerun is reproducible
    steps = [model._seed(_RunManager({"langgraph_node": "first", "langgraph_step": step})) for step in (1, 2)]
    assert steps[0] != steps[1]  # the same node at another step
    other = model.model_copy(update={"adapter": "anchor"})
    assert (other._seed(_RunManager({"langgraph_node": "first"}))
            != model._seed(_RunManager({"langgraph_node": "first"})))


class _RunManager:
    def __init__(self, metadata: dict) -> None:
        self.metadata = metadata


PROMPTS = ["I failed my driving test again", "My manager ignores my ideas in every meeting", "hi",
           "We missed the launch date and the client is angry", "My friend stopped answering",
           "I cannot sleep before big days", "Should I quit?", "Tell me one thing to try tonight"]


def personas_backend(tiny_model: Path, **settings: object) -> LocalBackend:
    adapters = {p.name: p for p in sorted((tiny_model / "adapters").iterdir()) if p.is_dir()}
    return LocalBackend.load(str(tiny_model), adapters=adapters, **settings)


def record_calls(monkeypatch: pytest.MonkeyPatch, backend: LocalBackend, *, fail: bool = False) -> list[int]:
    """Rows of each ``model.generate`` call; the first call is slowed down so that
    concurrent callers queue behind it, and with ``fail`` every call raises."""
    rows: list[int] = []
    generate = backend.model.generate

    def counted(**kwargs: object) -> torch.Tensor:
        rows.append(kwargs["input_ids"].shape[0])
        if len(rows) == 1:
            time.sleep(0.5)
        if fail:
            raise RuntimeError("boom")
        return generate(**kwargs)

    monkeypatch.setattr(backend.model, "generate", counted)
    return rows


def concurrently(calls: list) -> list:
    """Run the calls in threads released together; each one's result or exception, in order."""
    barrier = threading.Barrier(len(calls))
    outcomes: list = [None] * len(calls)

    def run(i: int) -> None:
        barrier.wait()
        try:
            outcomes[i] = calls[i]()
        except RuntimeError as exc:  # the test inspects it; anything else fails the test
            outcomes[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return outcomes


def test_concurrent_calls_are_batched_and_each_gets_its_own_reply(tiny_model: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    backend = personas_backend(tiny_model)
    names = [None, *backend.adapters]
    requests = [([[{"role": "user", "content": p}]], [names[i % len(names)]], 6 + i) for i, p in enumerate(PROMPTS)]
    requests[3] = ([[{"role": "user", "content": PROMPTS[3]}], CONVERSATION], ["anchor", None], 9)  # two rows
    alone = [backend.generate(c, adapters=a, temperature=0, max_new_tokens=n) for c, a, n in requests]
    rows = record_calls(monkeypatch, backend)
    batched = concurrently([lambda c=c, a=a, n=n: backend.generate(c, adapters=a, temperature=0, max_new_tokens=n)
                            for c, a, n in requests])
    # the first caller runs at once, alone; the others queued behind it share one batch
    assert rows == [1, len(PROMPTS)] or rows == [2, len(PROMPTS) - 1], rows
    # padding and the longer batch limit leave greedy replies exactly as they were alone
    assert batched == alone
    assert [g.completion_tokens for g in batched[0] + batched[1]] == [6, 7]


def test_calls_of_any_sampling_share_a_batch(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = personas_backend(tiny_model)
    temperatures = [0.0, 0.0, 0.7, 0.7, 0.0, 0.7, 0.0, 0.7]
    greedy_alone = backend.generate([CONVERSATION], temperature=0, max_new_tokens=4)
    rows = record_calls(monkeypatch, backend)
    outcomes = concurrently([lambda t=t: backend.generate([CONVERSATION], temperature=t, max_new_tokens=4)
                             for t in temperatures])
    assert all(len(o) == 1 for o in outcomes)
    assert rows == [1, 7], rows  # the first alone, then every setting in one batch
    assert all(o == greedy_alone for o, t in zip(outcomes, temperatures, strict=True) if t == 0)


def test_an_error_reaches_every_caller_of_the_batch(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = personas_backend(tiny_model)
    rows = record_calls(monkeypatch, backend, fail=True)
    outcomes = concurrently([lambda a=a: backend.generate([CONVERSATION], adapters=[a], max_new_tokens=4)
                             for a in ([None, *backend.adapters] * 2)[:8]])
    assert rows == [1, 7]
    assert all(isinstance(o, RuntimeError) and str(o) == "boom" for o in outcomes), outcomes
    monkeypatch.undo()
    assert backend.generate([CONVERSATION], max_new_tokens=3)[0].completion_tokens == 3  # still serving


def test_max_batch_one_serves_calls_one_at_a_time(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = personas_backend(tiny_model, max_batch=1)
    rows = record_calls(monkeypatch, backend)
    concurrently([lambda: backend.generate([CONVERSATION], max_new_tokens=4)] * 6)
    assert rows == [1] * 6
    with pytest.raises(ValueError, match="max_batch must be at least 1"):
        LocalBackend(backend.model, backend.tokenizer, name="x", max_batch=0)


def test_seeded_calls_batch_and_stay_reproducible(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = personas_backend(tiny_model)
    seeds = [1, 2, 3, 1, 2, 3]
    alone = [backend.generate([CONVERSATION], temperature=1.0, seed=s, max_new_tokens=10) for s in seeds]
    assert len({a[0].text for a in alone}) == 3  # different seeds, different replies
    rows = record_calls(monkeypatch, backend)
    # seeded calls among unseeded ones of other settings and a greedy call on an adapter
    company = [lambda: backend.generate([CONVERSATION], temperature=0.7, top_p=0.9, max_new_tokens=6),
               lambda: backend.generate([[{"role": "user", "content": PROMPTS[1]}]], adapters=["anchor"],
                                        temperature=0, max_new_tokens=12)]
    together = concurrently([lambda s=s: backend.generate([CONVERSATION], temperature=1.0, seed=s, max_new_tokens=10)
                             for s in seeds] + company)
    assert rows == [1, 7], rows  # the seeded calls were merged with the others
    assert together[: len(seeds)] == alone


def test_the_rows_of_a_seeded_call_differ_and_match_their_own_seeds(tiny_model: Path) -> None:
    backend = personas_backend(tiny_model)
    rows = backend.generate([CONVERSATION] * 3, temperature=1.0, seed=5, max_new_tokens=10)
    assert len({g.text for g in rows}) == 3
    # row i draws from seed + i: the second row is what a call seeded with 6 gets alone
    assert backend.generate([CONVERSATION], temperature=1.0, seed=6, max_new_tokens=10)[0] == rows[1]


def test_a_seeded_stream_yields_the_generated_reply(tiny_model: Path) -> None:
    backend = personas_backend(tiny_model)
    for settings in ({"temperature": 1.0, "seed": 4}, {"temperature": 0.8, "top_k": 5, "seed": 9},
                     {"temperature": 0}):
        whole = backend.generate([CONVERSATION], adapters=["beacon"], max_new_tokens=12, **settings)[0].text
        assert "".join(backend.stream(CONVERSATION, adapter="beacon", max_new_tokens=12, **settings)) == whole


def test_a_lone_call_never_waits_for_company(tiny_model: Path) -> None:
    backend = personas_backend(tiny_model, batch_window_s=30.0)
    start = time.monotonic()
    for _ in range(3):
        backend.generate([CONVERSATION], max_new_tokens=2)
    assert time.monotonic() - start < 10


def test_async_calls_beyond_the_default_thread_pool_meet_in_one_batch(tiny_model: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    from mascot.policies.local.chat_model import LocalChatModel

    backend = personas_backend(tiny_model, max_batch=16)
    rows = record_calls(monkeypatch, backend)
    chat = LocalChatModel(backend=backend, adapter="anchor", max_new_tokens=4, temperature=0)

    async def all_at_once() -> list:
        return await asyncio.gather(*(chat.ainvoke([("user", p)]) for p in PROMPTS * 2))

    replies = asyncio.run(all_at_once())  # the event loop's default pool holds only cores + 4 threads
    assert len(replies) == 16 and all(r.content is not None for r in replies)
    assert sum(rows) == 16 and max(rows) >= 12, rows


def test_a_caller_interrupted_in_the_queue_does_not_stall_the_others(tiny_model: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    backend = personas_backend(tiny_model)
    record_calls(monkeypatch, backend)  # the first generate takes 0.5 s: the others queue
    first = threading.Thread(target=backend.generate, args=([CONVERSATION],), kwargs={"max_new_tokens": 2})
    first.start()
    time.sleep(0.1)

    def interrupted_wait(*args: object) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(backend.batcher._queue_changed, "wait", interrupted_wait)
        with pytest.raises(KeyboardInterrupt):
            backend.generate([CONVERSATION], max_new_tokens=2)
    first.join(timeout=30)
    assert not backend.batcher._queue and backend.batcher._leader is None
    done = concurrently([lambda: backend.generate([CONVERSATION], max_new_tokens=2)])
    assert isinstance(done[0], list) and done[0][0].completion_tokens >= 1


def test_an_adapter_unloaded_while_queued_fails_only_its_callers(tiny_model: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    backend = personas_backend(tiny_model)
    record_calls(monkeypatch, backend)
    outcomes: list = []

    def unload_then_ask() -> None:
        time.sleep(0.1)  # while the first batch generates: queue two calls, then unload one's adapter
        threads = [threading.Thread(target=lambda a=a: outcomes.append(
            (a, _outcome(lambda: backend.generate([CONVERSATION], adapters=[a], max_new_tokens=2)))))
            for a in ("anchor", "catalyst")]
        for thread in threads:
            thread.start()
        time.sleep(0.1)
        backend.adapter_versions.pop("anchor")  # what unload_adapter records, without waiting for the lock
        for thread in threads:
            thread.join(timeout=30)

    helper = threading.Thread(target=unload_then_ask)
    helper.start()
    backend.generate([CONVERSATION], max_new_tokens=2)
    helper.join(timeout=60)
    results = dict(outcomes)
    assert isinstance(results["anchor"], ValueError) and "unknown adapter anchor" in str(results["anchor"])
    assert isinstance(results["catalyst"], list)


def _outcome(call: object) -> object:
    try:
        return call()  # type: ignore[operator]
    except ValueError as exc:
        return exc


def test_loading_a_name_already_loaded_is_refused(tiny_model: Path) -> None:
    backend = LocalBackend.load(str(tiny_model), adapters={"anchor": tiny_model / "adapters/anchor"})
    before = backend.generate([CONVERSATION], adapters=["anchor"], temperature=0, max_new_tokens=8)
    with pytest.raises(ValueError, match="adapter 'anchor' is already loaded; unload it first"):
        backend.load_adapter("anchor", tiny_model / "adapters/catalyst")
    assert backend.generate([CONVERSATION], adapters=["anchor"], temperature=0, max_new_tokens=8) == before
    backend.unload_adapter("anchor")  # a new version under the same name: unload, then load
    backend.load_adapter("anchor", tiny_model / "adapters/catalyst", version="2")
    assert backend.generate([CONVERSATION], adapters=["anchor"], temperature=0, max_new_tokens=8) != before
    assert backend.adapter_versions == {"anchor": "2"}
