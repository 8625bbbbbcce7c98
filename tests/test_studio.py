"""`langgraph dev` serves the director graph of langgraph.json (mascot.studio), offline.

The server test starts the real `langgraph dev` (the `studio` extra) on a free 127.0.0.1
port with a tiny-model policy file, drives its HTTP API with httpx, and checks that the
server made no outside call: every HTTP client in it sees a recording proxy on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import yaml

from mascot.rosters import USER, Roster
from mascot.studio import StudioError, graph_from_env

ROOT = Path(__file__).resolve().parents[1]
LANGGRAPH = Path(sys.executable).with_name("langgraph")


@pytest.mark.parametrize(("env", "message"), [
    ({}, "set MASCOT_POLICIES to a policy file, or MASCOT_MODEL to a model folder"),
    ({"MASCOT_POLICIES": "p.yaml", "MASCOT_MODEL": "m"}, "set MASCOT_POLICIES or MASCOT_MODEL, not both"),
    ({"MASCOT_ROSTER": "nope", "MASCOT_MODEL": "m"},
     "MASCOT_ROSTER: unknown roster 'nope': not a shipped roster (emotional_support, workplace_meeting)"),
    ({"MASCOT_POLICIES": "/no/such/policies.yaml"}, "MASCOT_POLICIES: /no/such/policies.yaml: cannot read file"),
    ({"MASCOT_MODEL": "./no-such-model"}, "MASCOT_MODEL: no model directory at no-such-model"),
])
def test_bad_variables_give_one_line_naming_the_variable(env: dict[str, str], message: str, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MASCOT_CACHE", str(tmp_path))  # no offline model built there
    with pytest.raises(StudioError) as caught:
        graph_from_env(env)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_without_model_variables_the_offline_model_is_served(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from mascot.studio import default_model

    monkeypatch.setenv("MASCOT_CACHE", str(tmp_path))
    assert default_model() == tmp_path / "qwen2.5-coder-0.5b-instruct"
    with pytest.raises(StudioError, match=f"mascot offline-model --out {tmp_path / 'qwen2.5-coder-0.5b-instruct'}"):
        graph_from_env({})
    built: list[tuple] = []
    monkeypatch.setattr("mascot.studio.is_offline_model", lambda folder: True)
    monkeypatch.setattr("mascot.studio._build", lambda *args: built.append(args) or "graph")
    assert graph_from_env({}) == "graph"
    assert built == [("emotional_support", None, str(tmp_path / "qwen2.5-coder-0.5b-instruct"))]


def test_the_graph_is_built_once_per_setting(tiny_model: Path) -> None:
    env = {"MASCOT_POLICIES": str(tiny_model / "policies.yaml")}
    graph = graph_from_env(env)
    assert graph_from_env(dict(env)) is graph
    assert graph.checkpointer is None  # the server brings its own
    assert {"director", "user", "anchor", "action_guide"} <= set(graph.nodes)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RecordingProxy:
    """A listener on 127.0.0.1 that records every connection made to it and closes it."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.requests: list[bytes] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    self.requests.append(conn.recv(200))
                except OSError:
                    self.requests.append(b"")

    def close(self) -> None:
        self.server.close()


@contextmanager
def langgraph_dev(cwd: Path, **variables: str) -> Iterator[tuple[str, RecordingProxy]]:
    """`langgraph dev` of langgraph.json with ``variables`` set, in ``cwd`` (the in-memory
    server keeps its threads in ./.langgraph_api); yields its URL and the proxy."""
    if not LANGGRAPH.is_file():
        pytest.skip("the `langgraph` CLI is not installed: pip install -e '.[studio]' (scripts/install does)")
    proxy = RecordingProxy()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LANGSMITH_", "LANGCHAIN_", "LANGGRAPH_", "MASCOT_"))}
    env.update(
        HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
        LANGSMITH_TRACING="false", LANGCHAIN_TRACING_V2="false",  # no traces to LangSmith
        LANGGRAPH_CLI_NO_ANALYTICS="1",  # the CLI's usage report
        LANGGRAPH_NO_VERSION_CHECK="true",  # the server's look-up of a newer langgraph-api on PyPI
        # any other outside call would reach the recording proxy
        HTTP_PROXY=f"http://127.0.0.1:{proxy.port}", HTTPS_PROXY=f"http://127.0.0.1:{proxy.port}",
        ALL_PROXY=f"http://127.0.0.1:{proxy.port}", NO_PROXY="127.0.0.1,localhost",
        **variables,
    )
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        env[name] = env[name.upper()]
    port = free_port()
    log_path = cwd / "server.log"
    with log_path.open("w") as log:
        server = subprocess.Popen(
            [str(LANGGRAPH), "dev", "--no-browser", "--no-reload", "--host", "127.0.0.1", "--port", str(port),
             "--config", str(ROOT / "langgraph.json")],
            cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 90
            url = None
            while True:
                assert server.poll() is None, log_path.read_text()[-3000:]
                # the server's own line: it takes another port when the one asked for was taken meanwhile
                url = url or next(iter(re.findall(r"API: \S*(http://127\.0\.0\.1:\d+)", log_path.read_text())), None)
                try:
                    if url and httpx.get(f"{url}/ok", timeout=2, trust_env=False).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, f"langgraph dev did not answer /ok within 90 s: {url}"
                time.sleep(0.3)
            yield url, proxy
        finally:
            os.killpg(server.pid, signal.SIGTERM)  # its own session: the server and anything it started
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait(timeout=20)
            proxy.close()
            shutil.rmtree(cwd / ".langgraph_api", ignore_errors=True)


def short_reply_policies(tiny_model: Path, out: Path) -> Path:
    """The tiny model's policy file (an adapter per persona) with 12-token replies."""
    policies = yaml.safe_load((tiny_model / "policies.yaml").read_text())
    policies["defaults"] = {"kind": "local", "model": str(tiny_model), "max_tokens": 12}
    policies["roles"] = {role: {**entry, "adapter": str(tiny_model / entry["adapter"])} if entry else {}
                         for role, entry in policies["roles"].items()}
    out.write_text(yaml.safe_dump(policies))
    return out


def sse_events(response: httpx.Response) -> Iterator[tuple[str, object]]:
    """(event, data) of a server-sent event stream."""
    event = None
    for line in response.iter_lines():
        if line.startswith("event: "):
            event = line.removeprefix("event: ")
        elif line.startswith("data: ") and event:
            yield event, json.loads(line.removeprefix("data: "))


def test_langgraph_dev_serves_the_director_graph(tiny_model: Path, tmp_path: Path, roster: Roster) -> None:
    policies = short_reply_policies(tiny_model, tmp_path / "policies.yaml")
    with langgraph_dev(tmp_path, MASCOT_ROSTER="emotional_support", MASCOT_POLICIES=str(policies)) as (url, proxy), \
            httpx.Client(base_url=url, timeout=120, trust_env=False) as client:
        [assistant] = client.post("/assistants/search", json={"graph_id": "director"}).json()
        thread = client.post("/threads", json={}).json()["thread_id"]
        run = client.post(f"/threads/{thread}/runs/wait", json={
            "assistant_id": assistant["assistant_id"],
            "input": {"messages": [{"role": "user", "content": "I failed my driving test again"}]},
        })
        assert run.status_code == 200, run.text
        state = client.get(f"/threads/{thread}/state").json()
        assert state["next"] == []  # the run ended at the person's turn
        messages = state["values"]["messages"]
        assert messages[0]["type"] == "human"
        voices = [m for m in messages[1:] if m["type"] == "ai"]
        assert voices and {m["name"] for m in voices} <= set(roster.persona_ids)
        assert all(m["additional_kwargs"]["stage_direction"]["speaker"] == m["name"] for m in voices)
        directions = state["values"]["directions"]
        assert [d["speaker"] for d in directions[:-1]] == [m["name"] for m in voices]
        assert directions[-1]["speaker"] == USER and state["values"]["round"] == 1

        # the next message is a new run on the same thread; Studio streams it token by token
        with client.stream("POST", f"/threads/{thread}/runs/stream", json={
            "assistant_id": assistant["assistant_id"],
            "input": {"messages": [{"role": "user", "content": "What should I do now?"}]},
            "stream_mode": ["messages-tuple", "updates"],
        }) as response:
            events = list(sse_events(response))
        tokens = [meta["langgraph_node"] for event, (chunk, meta) in
                  ((e, d) for e, d in events if e == "messages") if chunk["type"] == "AIMessageChunk"]
        assert set(tokens) & set(roster.persona_ids) and "director" in tokens
        updates = [next(iter(d)) for e, d in events if e == "updates"]
        assert updates[0] == "director" and updates[-1] == "user"
        state = client.get(f"/threads/{thread}/state").json()["values"]
        assert state["round"] == 2 and [m["type"] for m in state["messages"]].count("human") == 2
        assert proxy.requests == [], proxy.requests  # no outside call


def test_langgraph_dev_reports_a_bad_variable_in_the_run(tmp_path: Path) -> None:
    with langgraph_dev(tmp_path, MASCOT_ROSTER="nope", MASCOT_MODEL="unused") as (url, proxy), \
            httpx.Client(base_url=url, timeout=60, trust_env=False) as client:
        thread = client.post("/threads", json={}).json()["thread_id"]
        run = client.post(f"/threads/{thread}/runs/wait", json={
            "assistant_id": "director", "input": {"messages": [{"role": "user", "content": "hi"}]}})
        assert run.json().get("__error__") == {
            "error": "StudioError",
            "message": "MASCOT_ROSTER: unknown roster 'nope': not a shipped roster "
                       "(emotional_support, workplace_meeting) and no such file",
        }, run.text
        assert proxy.requests == [], proxy.requests
