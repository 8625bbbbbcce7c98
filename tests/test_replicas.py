"""Several servers behind one role: requests spread over the replicas, a dead one skipped."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import httpx
import pytest
from langchain_core.messages import HumanMessage

from mascot.cli import main
from mascot.policies import PolicySpec
from mascot.policies.policy_set import openai_chat_model
from mascot.policies.replicas import AsyncReplicaTransport, ReplicaTransport
from mascot.testing.stub_server import StubConfig, start_stub_server


def dead_url() -> str:
    """A loopback URL nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}/v1"


def test_requests_spread_over_replicas_and_skip_a_dead_one() -> None:
    with start_stub_server() as first, start_stub_server(StubConfig(latency_s=0.05)) as second:
        urls = [dead_url(), first.url, second.url]
        spec = PolicySpec(kind="openai", model="stub", base_url=urls, max_retries=0, temperature=0.0)
        model = openai_chat_model(spec)
        for _ in range(6):
            assert model.invoke([HumanMessage("hello")]).content

        async def many() -> list[str]:
            replies = await asyncio.gather(*(model.ainvoke([HumanMessage(f"hi {i}")]) for i in range(12)))
            return [r.content for r in replies]

        assert all(asyncio.run(many()))
        served = [first.stats()["requests"], second.stats()["requests"]]
    assert sum(served) == 18 and min(served) >= 4, served  # both replicas took a share, none was lost


def test_every_replica_down_is_the_clients_error() -> None:
    transport = ReplicaTransport([dead_url(), dead_url()])
    with httpx.Client(transport=transport) as client, pytest.raises(httpx.ConnectError):
        client.get(transport.replicas.urls[0] + "/models")
    with pytest.raises(ValueError, match="at least two URLs"):
        AsyncReplicaTransport(["http://127.0.0.1:1/v1"])
    with pytest.raises(ValueError, match="at least one URL"):
        PolicySpec(kind="openai", model="m", base_url=[])


def test_rollout_over_replicas_loses_no_episode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with start_stub_server() as first, start_stub_server() as second:
        out = tmp_path / "episodes.jsonl"
        code = main(["rollout", "--roster", "emotional_support", "--base-url", f"{first.url},{dead_url()},{second.url}",
                     "--model", "stub", "--episodes", "6", "--max-rounds", "1", "--concurrency", "4",
                     "--out", str(out)])
        assert code == 0, capsys.readouterr().err[-2000:]
        assert len(out.read_text().splitlines()) == 6
        assert first.stats()["requests"] > 0 and second.stats()["requests"] > 0


def test_an_unavailable_replica_is_passed_over() -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.host)
        return httpx.Response(503 if request.url.host == "10.0.0.1" else 200, json={"ok": True})

    urls = ["http://10.0.0.1:8000/v1", "http://10.0.0.2:8000/v1"]
    transport = ReplicaTransport(urls, transport=httpx.MockTransport(handler))
    with httpx.Client(transport=transport) as client:
        answers = [client.get(f"{urls[0]}/models").status_code for _ in range(4)]
    assert answers == [200] * 4
    assert seen.count("10.0.0.1") == 1  # tried once, then set aside for the cool-down
    single = ReplicaTransport(urls[:1] * 2, transport=httpx.MockTransport(handler))
    with httpx.Client(transport=single) as client:
        assert client.get(f"{urls[0]}/models").status_code == 503  # the last replica's answer stands
