"""The local OpenAI-compatible server on 127.0.0.1, driven by real clients (ChatOpenAI, httpx)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import yaml
from http_app import serve_app
from langchain_openai import ChatOpenAI

from mascot.graphs import create_director_graph
from mascot.policies import Policies
from mascot.policies.local import LocalBackend
from mascot.policies.local.server import ServerLimits, create_app
from mascot.policies.serving import ServedPolicies, client_policies, reload_adapters
from mascot.policies.vllm import CpuSettings, vllm_command
from mascot.rosters import Roster

KEY = "test-key-1234567890"




@pytest.fixture(scope="module")
def served(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> ServedPolicies:
    """Two of the tiny model's adapters, in an adapters folder the server may load from."""
    root = tmp_path_factory.mktemp("serve")
    shutil.copytree(tiny_model / "adapters", root / "adapters")
    policy = {"version": 1, "defaults": {"kind": "local", "model": str(tiny_model)},
              "roles": {"default": {}, "anchor": {"adapter": "adapters/anchor", "version": "1"},
                        "catalyst": {"adapter": "adapters/catalyst", "version": "1"}}}
    (root / "policies.yaml").write_text(yaml.safe_dump(policy))
    return ServedPolicies.from_file(root / "policies.yaml")


@pytest.fixture(scope="module")
def server(served: ServedPolicies) -> Iterator[str]:
    backend = LocalBackend.load(served.base, adapters={a.name: a.path for a in served.adapters.values()},
                                adapter_versions={a.name: a.version for a in served.adapters.values()})
    app = create_app(backend, served_name="tiny", api_key=KEY, adapters_dir=served.source.parent,
                     allow_runtime_lora=True, limits=ServerLimits(max_tokens=32, max_body_bytes=200_000))
    with serve_app(app) as url:
        yield url


def chat(url: str, model: str, **kwargs: object) -> ChatOpenAI:
    return ChatOpenAI(base_url=url, api_key=KEY, model=model, temperature=0, max_retries=0, **kwargs)


def test_models_lists_base_and_adapters(server: str) -> None:
    models = openai.OpenAI(base_url=server, api_key=KEY).models.list()
    assert [m.id for m in models.data] == ["tiny", "anchor", "catalyst"]


def test_each_adapter_answers_differently(server: str) -> None:
    prompt = [("user", "I failed my exam again.")]
    replies = {m: chat(server, m, max_tokens=8).invoke(prompt).content for m in ("tiny", "anchor", "catalyst")}
    assert len(set(replies.values())) == 3, replies
    assert chat(server, "anchor", max_tokens=8).invoke(prompt).content == replies["anchor"]  # greedy: stable


def test_streaming_matches_the_whole_reply(server: str) -> None:
    prompt = [("user", "Tell me one small step.")]
    whole = chat(server, "anchor", max_tokens=10).invoke(prompt).content
    pieces = [chunk.content for chunk in chat(server, "anchor", max_tokens=10, stream_usage=True).stream(prompt)]
    assert len([p for p in pieces if p]) > 1 and "".join(pieces) == whole


def test_max_completion_tokens_and_the_cap(server: str) -> None:
    client = openai.OpenAI(base_url=server, api_key=KEY)
    messages = [{"role": "user", "content": "Say something long."}]
    short = client.chat.completions.create(model="catalyst", messages=messages, max_completion_tokens=3,
                                           temperature=0)
    assert short.usage.completion_tokens <= 3 and short.choices[0].finish_reason == "length"
    old_style = client.chat.completions.create(model="catalyst", messages=messages, max_tokens=2, temperature=0)
    assert old_style.usage.completion_tokens <= 2
    capped = client.chat.completions.create(model="catalyst", messages=messages, max_tokens=5000, temperature=0)
    assert capped.usage.completion_tokens <= 32  # the server's cap
    several = client.chat.completions.create(model="tiny", messages=messages, max_tokens=4, n=3, seed=1)
    assert [c.index for c in several.choices] == [0, 1, 2]


def test_errors_are_openai_errors(server: str) -> None:
    client = openai.OpenAI(base_url=server, api_key=KEY, max_retries=0)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(model="nobody", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server, api_key="wrong", max_retries=0).models.list()
    assert httpx.get(server + "/models").status_code == 401
    auth = {"Authorization": f"Bearer {KEY}"}
    bad = httpx.post(server + "/chat/completions", headers=auth, json={"model": "tiny", "messages": []})
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "BadRequestError"
    garbage = httpx.post(server + "/chat/completions", headers={**auth, "content-type": "application/json"},
                         content=b"{not json")
    assert garbage.status_code == 400 and "error" in garbage.json()
    huge = httpx.post(server + "/chat/completions", headers=auth,
                      json={"model": "tiny", "messages": [{"role": "user", "content": "x" * 300_000}]})
    assert huge.status_code == 413
    too_many = httpx.post(server + "/chat/completions", headers=auth,
                          json={"model": "tiny", "n": 50, "messages": [{"role": "user", "content": "hi"}]})
    assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "n"
    assert httpx.get(server.removesuffix("/v1") + "/health").status_code == 200  # no key needed


def test_hot_load_use_and_unload_an_adapter(server: str, served: ServedPolicies, tiny_model: Path) -> None:
    shutil.copytree(tiny_model / "adapters" / "beacon", served.source.parent / "adapters" / "fresh")
    auth = {"Authorization": f"Bearer {KEY}"}
    loaded = httpx.post(server + "/load_lora_adapter", headers=auth,
                        json={"lora_name": "fresh", "lora_path": "adapters/fresh"})
    assert loaded.status_code == 200 and "added" in loaded.text
    assert chat(server, "fresh", max_tokens=4).invoke([("user", "hello")]).content
    assert "fresh" in [m.id for m in openai.OpenAI(base_url=server, api_key=KEY).models.list().data]
    assert httpx.post(server + "/unload_lora_adapter", headers=auth, json={"lora_name": "fresh"}).status_code == 200
    with pytest.raises(openai.NotFoundError):
        chat(server, "fresh").invoke([("user", "hello")])
    assert httpx.post(server + "/unload_lora_adapter", headers=auth, json={"lora_name": "fresh"}).status_code == 404


def test_adapter_paths_cannot_escape_the_adapters_folder(server: str, served: ServedPolicies,
                                                        tiny_model: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    shutil.copytree(tiny_model / "adapters" / "beacon", outside)
    (served.source.parent / "adapters" / "sneaky").symlink_to(outside)
    auth = {"Authorization": f"Bearer {KEY}"}
    for path in ("../../outside", str(outside), "adapters/sneaky", "adapters/../..", "/etc", "adapters/missing"):
        response = httpx.post(server + "/load_lora_adapter", headers=auth,
                              json={"lora_name": "evil", "lora_path": path})
        assert response.status_code == 400 and response.json()["error"]["param"] == "lora_path", path
    assert httpx.post(server + "/load_lora_adapter", headers=auth,
                      json={"lora_name": "../x", "lora_path": "adapters/anchor"}).status_code == 400


def test_loading_a_name_already_loaded_is_refused(server: str, served: ServedPolicies) -> None:
    prompt = [("user", "I failed my exam again.")]
    before = chat(server, "anchor", max_tokens=8).invoke(prompt).content
    auth = {"Authorization": f"Bearer {KEY}"}
    again = httpx.post(server + "/load_lora_adapter", headers=auth,
                       json={"lora_name": "anchor", "lora_path": "adapters/catalyst"})
    assert again.status_code == 400, again.text
    error = again.json()["error"]
    assert error["type"] == "BadRequestError" and error["param"] == "lora_name"
    assert "'anchor' has already been loaded" in error["message"] and "unload" in error["message"]
    assert chat(server, "anchor", max_tokens=8).invoke(prompt).content == before  # not replaced


def test_error_bodies_never_show_the_adapters_folder(server: str, served: ServedPolicies) -> None:
    root = served.source.parent
    empty, broken, misfit = (root / "adapters" / name for name in ("empty", "broken", "misfit"))
    empty.mkdir(exist_ok=True)
    shutil.copytree(root / "adapters" / "anchor", broken, dirs_exist_ok=True)
    (broken / "adapter_model.safetensors").write_bytes(b"not a safetensors file")
    shutil.copytree(root / "adapters" / "anchor", misfit, dirs_exist_ok=True)
    config = json.loads((misfit / "adapter_config.json").read_text())
    (misfit / "adapter_config.json").write_text(json.dumps({**config, "target_modules": ["no_such_proj"]}))
    auth = {"Authorization": f"Bearer {KEY}"}
    loads = [("out", "../../elsewhere"), ("out", "/etc"), ("out", "adapters/missing"), ("anchor", "adapters/anchor"),
             ("empty", "adapters/empty"), ("empty", str(empty)), ("broken", "adapters/broken"),
             ("misfit", "adapters/misfit")]
    messages = []
    for name, path in loads:
        response = httpx.post(server + "/load_lora_adapter", headers=auth, json={"lora_name": name, "lora_path": path})
        assert response.status_code == 400, (path, response.text)
        assert str(root) not in response.text and str(root.resolve()) not in response.text, response.text
        messages.append(response.json()["error"]["message"])
    assert "the adapters folder" in messages[0] and "adapters/empty" in messages[4], messages
    assert {m.id for m in openai.OpenAI(base_url=server, api_key=KEY).models.list().data} == {"tiny", "anchor",
                                                                                             "catalyst"}


def test_reload_pushes_the_policy_files_adapters(server: str, served: ServedPolicies) -> None:
    with httpx.Client() as client:
        assert reload_adapters(server, served, api_key=KEY, client=client) == ["anchor", "catalyst"]
    assert {"anchor", "catalyst"} <= {m.id for m in openai.OpenAI(base_url=server, api_key=KEY).models.list().data}


def test_director_graph_over_http(server: str, served: ServedPolicies, roster: Roster, tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MASCOT_TEST_KEY", KEY)
    data = client_policies(served, server, api_key_env="MASCOT_TEST_KEY")
    for entry in data["roles"].values():
        entry.update(max_tokens=16, temperature=1.0, model="tiny" if entry["model"] == served.base else entry["model"])
    (tmp_path / "client.yaml").write_text(yaml.safe_dump(data))
    assert data["roles"]["anchor"] == {"kind": "openai", "base_url": server, "model": "anchor", "version": "1",
                                       "api_key_env": "MASCOT_TEST_KEY", "max_tokens": 16, "temperature": 1.0}
    policies = Policies.from_file(tmp_path / "client.yaml", roster, seed=0)
    graph = create_director_graph(roster, director=policies.chat_model("director"), speakers=policies.speakers(),
                                  max_speakers_per_round=2, structured_output=True).compile()
    state = graph.invoke({"messages": [("user", "I failed my exam again.")]})
    spoken = [m for m in state["messages"] if m.type == "ai"]
    assert spoken and len(state["directions"]) >= 2
    # every turn came over HTTP from the adapter (or base) the policy file names for its role
    assert all(m.response_metadata["model_name"] == data["roles"].get(m.name, data["roles"]["default"])["model"]
               for m in spoken)


def test_vllm_command_for_a_policy_file(served: ServedPolicies) -> None:
    argv, env = vllm_command(served, python="/venv/bin/python", host="0.0.0.0", port=9000, api_key_env="MY_KEY",
                             allow_runtime_lora=True)
    assert argv[:9] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", served.base,
                        "--host", "0.0.0.0", "--port", "9000"]
    modules = argv[argv.index("--lora-modules") + 1: argv.index("--max-lora-rank")]
    assert modules == [f"anchor={served.adapters['anchor'].path}", f"catalyst={served.adapters['catalyst'].path}"]
    assert argv[argv.index("--max-lora-rank") + 1] == "8" and argv[argv.index("--max-loras") + 1] == "2"
    assert "--enable-lora" in argv and not any(KEY in a or "MY_KEY" in a for a in argv)
    assert env == {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "VLLM_API_KEY": "$MY_KEY"}
    assert "--dtype" not in argv  # a GPU chooses its own precision
    # LoRA on the adapters' own modules alone (vLLM wraps every linear layer otherwise: 2.2x slower on a CPU)
    assert argv[argv.index("--lora-target-modules") + 1:][:4] == ["k_proj", "o_proj", "q_proj", "v_proj"]
    assert vllm_command(served, lora_target_modules=["o_proj"])[0][-2:] == ["--lora-target-modules", "o_proj"]
    assert "--lora-target-modules" not in vllm_command(ServedPolicies(base=served.base))[0]


def test_an_adapter_of_modules_the_server_leaves_out_is_refused(served: ServedPolicies) -> None:
    from mascot.policies.spec import PolicyError
    from mascot.policies.vllm import load_adapters

    # vLLM would load it and leave the weights of k_proj and v_proj out, silently
    with pytest.raises(PolicyError, match="adapts k_proj, v_proj, which the vLLM server .* puts no LoRA on"):
        load_adapters("http://127.0.0.1:9/v1", served.adapters.values(), allowed=["q_proj", "o_proj"])
    argv, env = vllm_command(served, cpu=CpuSettings(dtype="bfloat16", kv_cache_gib=3, threads_bind="0-1"))
    assert argv[argv.index("--dtype") + 1] == "bfloat16" and argv[argv.index("--max-model-len") + 1] == "4096"
    assert argv[argv.index("--max-num-batched-tokens") + 1] == "4096"  # no split prefill of a seeded request
    assert "--no-enable-chunked-prefill" in argv
    assert env == {"VLLM_CPU_KVCACHE_SPACE": "3", "VLLM_CPU_OMP_THREADS_BIND": "0-1"}
    assert os.environ.get("MY_KEY") is None


def test_cpu_settings_follow_the_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mascot.policies.vllm import command

    (tmp_path / "model.safetensors").write_bytes(b"x" * 1000)
    monkeypatch.setattr(command, "_cpu_flags", lambda: {"avx512f", "avx512_bf16"})
    monkeypatch.setattr(command, "_available_memory", lambda: 20 << 30)
    monkeypatch.setattr(command.os, "sched_getaffinity", lambda pid: {0, 1, 2, 5})
    settings = command.cpu_settings(str(tmp_path))
    assert settings == command.CpuSettings(dtype="bfloat16", kv_cache_gib=2, threads_bind="0-2,5")
    monkeypatch.setattr(command, "_cpu_flags", lambda: {"avx2"})
    monkeypatch.setattr(command, "_available_memory", lambda: 6 << 30)
    with (tmp_path / "model.safetensors").open("wb") as weights:
        weights.truncate(1 << 30)  # 1 GiB of 16-bit weights, 2 GiB in fp32: (6 - 4 - 2) / 2 -> the minimum 1
    assert command.cpu_settings(str(tmp_path)) == command.CpuSettings("float32", 1, "0-2,5")
    monkeypatch.setattr(command, "_available_memory", lambda: 14 << 30)
    assert command.cpu_settings(str(tmp_path)).kv_cache_gib == 2  # (14 - 4 - 2) / 2, at most 2
    # a server started before takes its memory only as requests come: promised, it is subtracted
    assert command.cpu_settings(str(tmp_path), reserved=6 << 30).kv_cache_gib == 1  # (14 - 6 - 4 - 2) / 2


def test_a_pool_sizes_its_next_server_after_the_memory_of_the_ones_it_started(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mascot.policies.serving import ServedPolicies
    from mascot.policies.vllm import command
    from mascot.policies.vllm import pool as vllm_pool
    from mascot.policies.vllm import server as vllm_server

    (tmp_path / "model.safetensors").write_bytes(b"x" * (1 << 20))
    monkeypatch.setattr(command, "_cpu_flags", lambda: {"avx2"})
    monkeypatch.setattr(vllm_server, "has_gpu", lambda: False)
    server = vllm_server.VllmServer(ServedPolicies(base=str(tmp_path)))
    assert server.memory() == 0  # nothing sized yet
    monkeypatch.setattr(command, "_available_memory", lambda: 7 << 30)
    _, env = server.command(python="python")
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert server.memory() == (2 << 20) + (2 << 30)  # fp32 weights (twice the file) and the KV cache
    second = vllm_server.VllmServer(ServedPolicies(base=str(tmp_path)), reserved_memory=server.memory())
    _, env = second.command(python="python")
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"  # (7 - 2 - 2) / 2, less the weights' few MiB
    # the pool promises the first server's memory to the second it starts
    def start(self: vllm_server.VllmServer) -> vllm_server.VllmServer:
        self.command(python="python")
        self.started_in = 0.0
        return self

    monkeypatch.setattr(vllm_server.VllmServer, "start", start)
    other = tmp_path / "other"
    other.mkdir()
    (other / "model.safetensors").write_bytes(b"x" * (1 << 20))
    pool = vllm_pool.VllmPool(attach={})
    pool.url(str(tmp_path))
    pool.url(str(other))
    first, then = pool.servers.values()
    assert then.reserved_memory == first.memory() > 2 << 30 and then.cpu.kv_cache_gib == 1
