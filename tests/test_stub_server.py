"""The stub chat server: OpenAI-compatible answers, injected faults, counters and its CLI."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_openai import ChatOpenAI

from mascot.graphs.direction import StageDirection
from mascot.graphs.prompts import director_messages
from mascot.rosters import USER, Roster
from mascot.testing.stub_server import StubConfig, StubServer, main, start_stub_server

DIRECTOR = (
    "You are the Director of a test.\n\nVoices who may speak now:\n- anchor: The Anchor.\n- skeptic: The Skeptic.\n\n"
    'Reply with one JSON object with the keys "speaker" (the id of the voice, or "user" to hand the turn back to '
    'the person), "action" and "tone".'
)


@pytest.fixture(scope="module")
def server() -> Iterator[StubServer]:
    with start_stub_server() as running:
        yield running


def chat(url: str, **kw: object) -> ChatOpenAI:
    return ChatOpenAI(base_url=url, api_key="x", model="stub", max_retries=0, **kw)


def post(server: StubServer, body: dict, **headers: str) -> httpx.Response:
    return httpx.post(f"{server.url}/chat/completions", json=body, headers=headers, timeout=5)


def test_plain_completion_has_the_openai_shape(server: StubServer) -> None:
    body = {"model": "my-model", "messages": [{"role": "user", "content": "one two three"}]}
    response = post(server, body)
    assert response.status_code == 200
    data = response.json()
    assert data["object"] == "chat.completion" and data["model"] == "my-model"
    choice = data["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] == "stop"
    content = choice["message"]["content"]
    assert content and not content.startswith("{") and ":" not in content.split()[0]
    words = len(content.split())
    assert data["usage"] == {"prompt_tokens": 3, "completion_tokens": words,
                             "total_tokens": 3 + words}
    assert post(server, body).json()["choices"][0]["message"]["content"] != content


def test_models_unknown_paths_and_bad_bodies(server: StubServer) -> None:
    models = httpx.get(f"{server.url}/models").json()
    assert [m["id"] for m in models["data"]] == ["stub"]
    assert httpx.get(server.url.removesuffix("/v1") + "/stats").json() == server.stats()
    missing = httpx.get(f"{server.url}/nothing")
    assert missing.status_code == 404 and "error" in missing.json()
    bad = httpx.post(f"{server.url}/chat/completions", content=b"{not json", timeout=5)
    assert bad.status_code == 400 and "error" in bad.json()


def test_keep_alive_reuses_one_connection(server: StubServer) -> None:
    body = {"model": "stub", "messages": [{"role": "user", "content": "hi"}]}
    with httpx.Client(timeout=5) as client:
        ports = set()
        for _ in range(5):
            response = client.post(f"{server.url}/chat/completions", json=body)
            assert response.status_code == 200
            ports.add(response.extensions["network_stream"].get_extra_info("client_addr")[1])
    assert len(ports) == 1


def test_chat_openai_invoke_ainvoke_and_stream(server: StubServer) -> None:
    model = chat(server.url)
    reply = model.invoke("hello there")
    assert reply.content and reply.usage_metadata["input_tokens"] == 2
    assert asyncio.run(model.ainvoke("hello")).content
    chunks = list(chat(server.url, stream_usage=True).stream("hello"))
    text = "".join(c.content for c in chunks)
    assert len(chunks) > 3 and len(text.split()) > 3 and text == text.strip()
    assert sum(c.usage_metadata["output_tokens"] for c in chunks if c.usage_metadata) == len(
        text.split())


def test_director_prompt_gets_a_json_direction_with_an_allowed_speaker(
    server: StubServer, roster: Roster
) -> None:
    prompt = director_messages(roster, [HumanMessage("I failed my driving test again")],
                               round_turns=1, max_speakers_per_round=3, min_speakers_per_round=1)
    model = chat(server.url)
    speakers = set()
    for _ in range(len(roster.persona_ids) + 1):
        direction = StageDirection.model_validate_json(model.invoke(prompt).content)
        speakers.add(direction.speaker)
    assert speakers == {*roster.persona_ids, USER}
    handmade = {json.loads(model.invoke([SystemMessage(DIRECTOR)]).content)["speaker"]
                for _ in range(3)}
    assert handmade == {"anchor", "skeptic", USER}
    no_ids = model.invoke([SystemMessage("You are the Director. Pick anyone.")]).content
    assert json.loads(no_ids)["speaker"] == USER


def test_response_format_gets_json(server: StubServer) -> None:
    structured = chat(server.url).with_structured_output(StageDirection, method="json_schema")
    direction = structured.invoke([SystemMessage(DIRECTOR), HumanMessage("who next?")])
    assert isinstance(direction, StageDirection)
    assert direction.speaker in {"anchor", "skeptic", USER}


@pytest.mark.parametrize("fault,status", [("500", 500), ("429", 429)])
def test_error_faults(fault: str, status: int) -> None:
    with start_stub_server(StubConfig(fail_rate=1.0, faults=(fault,))) as failing:
        response = post(failing, {"model": "stub", "messages": []})
        assert response.status_code == status and "error" in response.json()
        if fault == "429":
            assert response.headers["retry-after"] == "0"
            with pytest.raises(openai.RateLimitError):
                chat(failing.url).invoke("hi")
        else:
            with pytest.raises(openai.InternalServerError):
                chat(failing.url).invoke("hi")
        assert failing.stats()["faults"] == {fault: 2}


def test_timeout_fault_stalls_past_the_client_timeout() -> None:
    with start_stub_server(StubConfig(fail_rate=1.0, faults=("timeout",), stall_s=2)) as slow:
        start = time.perf_counter()
        with pytest.raises(openai.APITimeoutError):
            chat(slow.url, timeout=0.3).invoke("hi")
    assert time.perf_counter() - start < 1.5  # closing did not wait for the stall either


def test_disconnect_fault_drops_the_connection() -> None:
    with start_stub_server(StubConfig(fail_rate=1.0, faults=("disconnect",))) as rude:
        with pytest.raises(openai.APIConnectionError):
            chat(rude.url).invoke("hi")
        assert rude.stats() == {"requests": 1, "ok": 0, "errors": 0,
                                "faults": {"disconnect": 1}}


def test_truncated_fault_cuts_the_body_halfway() -> None:
    with start_stub_server(StubConfig(fail_rate=1.0, faults=("truncated",))) as cut:
        with pytest.raises(httpx.RemoteProtocolError):
            post(cut, {"model": "stub", "messages": [{"role": "user", "content": "hi"}]})
        with pytest.raises(openai.APIConnectionError):
            chat(cut.url).invoke("hi")
        assert cut.stats()["faults"] == {"truncated": 2}


def test_rate_limit_retry_after_is_honoured_by_the_client() -> None:
    with start_stub_server(StubConfig(fail_rate=1.0, faults=("429",), retry_after_s=0.6)) as limited:
        start = time.perf_counter()
        with pytest.raises(openai.RateLimitError):
            ChatOpenAI(base_url=limited.url, api_key="x", model="stub", max_retries=1).invoke("hi")
        assert time.perf_counter() - start >= 0.6  # one retry, after the server's Retry-After
        assert limited.stats()["faults"] == {"429": 2}


def test_fault_rate_is_plausible_and_stats_add_up() -> None:
    config = StubConfig(fail_rate=0.3, faults=("500", "429"), seed=7)
    with start_stub_server(config) as flaky, httpx.Client(timeout=5) as client:
        body = {"model": "stub", "messages": [{"role": "user", "content": "hi"}]}
        codes = [client.post(f"{flaky.url}/chat/completions", json=body).status_code
                 for _ in range(200)]
        stats = flaky.stats()
    faults = sum(stats["faults"].values())
    assert 30 <= faults <= 90
    assert stats["requests"] == 200 == stats["ok"] + faults
    assert codes.count(500) == stats["faults"]["500"] and codes.count(429) == stats["faults"]["429"]


def test_echo_auth_leaks_the_key() -> None:
    with start_stub_server(StubConfig(echo_auth=True)) as leaky:
        model = ChatOpenAI(base_url=leaky.url, api_key="sk-secret-123", model="stub",
                           max_retries=0)
        assert "sk-secret-123" in model.invoke("hi").content
        direction = json.loads(model.invoke([SystemMessage(DIRECTOR)]).content)
        assert "sk-secret-123" in direction["action"]


def test_concurrent_requests_overlap() -> None:
    async def burst(url: str) -> list[str]:
        model = chat(url)
        return [r.content for r in await asyncio.gather(*(model.ainvoke("hi") for _ in range(50)))]

    with start_stub_server(StubConfig(latency_s=0.1)) as slow:
        start = time.perf_counter()
        replies = asyncio.run(burst(slow.url))
        elapsed = time.perf_counter() - start
        assert slow.stats()["ok"] == 50
    assert len(replies) == 50 and all(replies)
    assert elapsed < 1.5  # 50 requests in sequence would take 5 s


def test_bad_config_and_host_are_refused() -> None:
    with pytest.raises(ValueError, match="'oops'.*500, 429, timeout, disconnect"):
        StubConfig(faults=("oops",))
    with pytest.raises(ValueError, match="fail_rate=1.5"):
        StubConfig(fail_rate=1.5)
    with pytest.raises(ValueError, match="0.0.0.0"):
        start_stub_server(host="0.0.0.0")
    with pytest.raises(SystemExit) as exit_info:
        main(["--fail-rate", "2"])
    assert exit_info.value.code == 2


def test_cli_serves_and_stops_on_sigterm() -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "mascot.testing.stub_server", "--latency", "0.01"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith("stub server at http://127.0.0.1:") and line.endswith("/v1")
        url = line.removeprefix("stub server at ")
        assert chat(url).invoke("hi").content
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=5)
    finally:
        proc.kill()
    assert proc.returncode == 0 and out == "" and "Traceback" not in err


def test_cli_refuses_a_non_loopback_host() -> None:
    result = subprocess.run([sys.executable, "-m", "mascot.testing.stub_server", "--host", "0.0.0.0"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1 and "0.0.0.0" in result.stderr
