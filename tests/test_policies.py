from __future__ import annotations

import json
import logging
from pathlib import Path

import httpx
import pytest
import yaml
from langchain_core.messages import HumanMessage

from mascot.graphs import create_director_graph
from mascot.policies import Policies, PolicyError, PolicySpec, load_policy_specs, openai_chat_model
from mascot.rosters import USER

SECRET = "sk-test-must-never-leak-0123456789"


def _write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "policies.yaml"
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def test_policy_file_defaults_and_relative_paths(tmp_path: Path, roster) -> None:
    path = _write(tmp_path, {
        "defaults": {"kind": "local", "model": "."},
        "roles": {"anchor": {"adapter": "adapters/anchor", "version": "3"},
                  "director": {"kind": "openai", "model": "director-v2", "base_url": "http://127.0.0.1:9/v1",
                               "api_key_env": "MASCOT_TEST_KEY"},
                  "default": {}},
    })
    specs = load_policy_specs(path, roster)
    assert specs["anchor"].adapter == str(tmp_path / "adapters" / "anchor")
    assert specs["anchor"].model == str(tmp_path)
    assert specs["director"].kind == "openai" and specs["director"].model == "director-v2"
    policies = Policies(specs, roster)
    assert policies.spec("beacon") == specs["default"]


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"roles": {"socrates": {"model": "m"}}},
         "unknown role 'socrates' for roster 'emotional_support'; valid: director, user, judge, default, anchor"),
        ({"roles": {"anchor": {"model": "m", "temprature": 1}}},
         "role 'anchor': field 'temprature': Extra inputs are not permitted"),
        ({"roles": {"anchor": {"kind": "openai", "model": "m", "adapter": "x"}}}, "adapter is for kind 'local'"),
        ({"roles": {"anchor": {"kind": "local", "model": "m", "base_url": "http://x"}}},
         "base_url and api_key_env are for kind 'openai'"),
        ({"roles": {"anchor": {"kind": "cloud", "model": "m"}}}, "field 'kind'"),
        ({"roles": {}}, "no roles defined"),
        ({"rols": {}}, "field 'rols'"),
        ("roles: [unclosed", "malformed YAML"),
    ],
)
def test_bad_policy_files(tmp_path: Path, roster, data, expected: str) -> None:
    path = _write(tmp_path, data)
    with pytest.raises(PolicyError) as info:
        load_policy_specs(path, roster)
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_missing_policy_file(tmp_path: Path, roster) -> None:
    with pytest.raises(PolicyError, match="nope.yaml: cannot read file"):
        load_policy_specs(tmp_path / "nope.yaml", roster)


def test_missing_api_key_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MASCOT_TEST_KEY", raising=False)
    spec = PolicySpec(kind="openai", model="m", base_url="http://127.0.0.1:9/v1", api_key_env="MASCOT_TEST_KEY")
    with pytest.raises(PolicyError, match="MASCOT_TEST_KEY .* is not set"):
        openai_chat_model(spec)


def test_openai_compatible_roles_drive_the_graph(roster, monkeypatch, caplog, tmp_path: Path) -> None:
    """Director and speakers over HTTP (MockTransport): request bodies, key handling, no leak."""
    monkeypatch.setenv("MASCOT_TEST_KEY", SECRET)
    requests: list[dict] = []
    replies = iter([
        json.dumps({"speaker": "catalyst", "action": "probe", "tone": "curious"}),
        "What does 'again' mean to you?",
        json.dumps({"speaker": USER, "action": "ask", "tone": "warm"}),
    ])

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        requests.append({"url": str(request.url), "auth": request.headers["authorization"], "body": body})
        return httpx.Response(200, json={
            "id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": next(replies)}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        })

    path = _write(tmp_path, {
        "defaults": {"kind": "openai", "base_url": "http://127.0.0.1:8000/v1", "api_key_env": "MASCOT_TEST_KEY",
                     "max_tokens": 64},
        "roles": {"director": {"model": "director-adapter"}, "default": {"model": "speaker-base"},
                  "catalyst": {"model": "catalyst-adapter", "temperature": 0.2}},
    })
    policies = Policies.from_file(path, roster, seed=7,
                                  http_client=httpx.Client(transport=httpx.MockTransport(handler)))
    caplog.set_level(logging.DEBUG)
    graph = create_director_graph(roster, director=policies.chat_model("director"), speakers=policies.speakers(),
                                  structured_output=True).compile()
    state = graph.invoke({"messages": [HumanMessage("I failed my driving test again")]})
    assert [(m.name, m.text) for m in state["messages"][1:]] == [("catalyst", "What does 'again' mean to you?")]
    assert state["messages"][1].response_metadata["model_name"] == "catalyst-adapter"
    assert [r["body"]["model"] for r in requests] == ["director-adapter", "catalyst-adapter", "director-adapter"]
    assert requests[0]["url"] == "http://127.0.0.1:8000/v1/chat/completions"
    assert requests[0]["body"]["response_format"]["type"] == "json_schema"
    assert requests[1]["body"]["temperature"] == 0.2
    # each call its own seed, mixed from the run's seed and the call's node and step: not 7 for all
    seeds = [r["body"]["seed"] for r in requests]
    assert len(set(seeds)) == 3 and 7 not in seeds and all(0 <= s < 2**63 for s in seeds)
    assert requests[1]["auth"] == f"Bearer {SECRET}"
    assert SECRET not in repr(policies.chat_model("director"))
    assert SECRET not in caplog.text
    assert SECRET not in policies.describe("catalyst")


def test_no_key_sent_without_api_key_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["authorization"])
        return httpx.Response(500, json={"error": {"message": "boom"}})

    model = openai_chat_model(PolicySpec(kind="openai", model="m", base_url="http://127.0.0.1:8000/v1", max_retries=0),
                              http_client=httpx.Client(transport=httpx.MockTransport(handler)))
    with pytest.raises(Exception, match="boom"):
        model.invoke("hi")
    assert seen == ["Bearer EMPTY"]


def test_each_role_has_its_own_reply_budget(roster) -> None:
    import argparse

    from mascot.cli.options import budgets, with_budgets
    from mascot.policies import ROLE_MAX_TOKENS, SPEAKER_MAX_TOKENS

    policies = Policies.single(PolicySpec(model="some/model"), roster)
    assert policies.max_tokens("director") == ROLE_MAX_TOKENS["director"]
    assert policies.max_tokens("user") == ROLE_MAX_TOKENS["user"]
    assert policies.max_tokens("judge") == ROLE_MAX_TOKENS["judge"]
    assert policies.max_tokens("anchor") == SPEAKER_MAX_TOKENS
    per_role = with_budgets(policies, budgets("director=50,speakers=70"))
    assert [per_role.max_tokens(r) for r in ("director", "anchor", "beacon", "user", "judge")] == \
        [50, 70, 70, ROLE_MAX_TOKENS["user"], ROLE_MAX_TOKENS["judge"]]  # speakers' budget never reaches others
    everyone = with_budgets(policies, budgets("16"))
    assert {everyone.max_tokens(r) for r in ("director", "anchor", "user", "judge")} == {16}
    explicit = Policies.single(PolicySpec(model="some/model", max_tokens=33), roster)
    assert explicit.max_tokens("director") == 33  # a spec's own value wins over the role default
    with pytest.raises(argparse.ArgumentTypeError, match="unknown role 'narrator'"):
        budgets("narrator=5")
    with pytest.raises(argparse.ArgumentTypeError, match="must be >= 1"):
        budgets("director=0")


def test_dtype_of_a_local_policy(roster, tiny_model: Path) -> None:
    import torch

    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        policies = Policies.single(PolicySpec(model=str(tiny_model), dtype=name), roster)
        assert next(policies.chat_model("anchor").backend.model.parameters()).dtype == dtype
    with pytest.raises(ValueError, match="dtype is for kind 'local'"):
        PolicySpec(kind="openai", model="m", base_url="http://127.0.0.1:9/v1", dtype="float32")
    with pytest.raises(ValueError):
        PolicySpec(model="m", dtype="int3")


def test_each_call_sends_its_own_reproducible_seed() -> None:
    """The seed defect: every request of a rollout once carried the run's seed itself, so every
    voice drew the same numbers. Now the seed follows the call's episode, sample and adapter."""
    seeds: list[int | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seeds.append(json.loads(request.content).get("seed"))
        return httpx.Response(200, json={
            "id": "x", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}]})

    client = httpx.Client(transport=httpx.MockTransport(handler))
    spec = PolicySpec(kind="openai", model="anchor", base_url="http://127.0.0.1:8000/v1")
    model = openai_chat_model(spec, seed=0, http_client=client)
    for episode in ("e1", "e1", "e2"):
        model.invoke("hi", config={"metadata": {"episode_id": episode, "sample": 0}})
    model.invoke("hi", config={"metadata": {"episode_id": "e1", "sample": 1}})
    openai_chat_model(spec.model_copy(update={"model": "catalyst"}), seed=0, http_client=client).invoke(
        "hi", config={"metadata": {"episode_id": "e1", "sample": 0}})
    model.invoke("hi", seed=5)  # a seed given to the call is sent as is
    openai_chat_model(spec, http_client=client).invoke("hi")  # no run seed: none sent
    assert seeds[0] == seeds[1] and len(set(seeds[1:5])) == 4 and 0 not in seeds[:5]
    assert seeds[5:] == [5, None]
