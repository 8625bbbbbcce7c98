"""The vLLM servers of a command or a pipeline (``VllmPool``): one per base model, adapters
loaded in place as policy sets need them, running servers used through
``$MASCOT_VLLM_SERVERS``. Against the local server, which speaks vLLM's runtime-LoRA API;
the real engine is in test_vllm.py."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import httpx
import pytest
import yaml
from http_app import serve_app

from mascot.cli import main
from mascot.policies import Policies, PolicySpec
from mascot.policies.local import LocalBackend
from mascot.policies.local.server import create_app
from mascot.policies.vllm import VLLM_SERVERS_ENV, VllmError, VllmPool, attached_servers
from mascot.policies.vllm import pool as vllm_pool
from mascot.rosters import Roster


@pytest.fixture(scope="module")
def served_root(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pool")
    shutil.copytree(tiny_model / "adapters", root / "adapters")
    (root / "policies.yaml").write_text(yaml.safe_dump({
        "version": 1, "defaults": {"kind": "local", "model": str(tiny_model)},
        "roles": {"default": {}, "anchor": {"adapter": str(root / "adapters" / "anchor"), "version": "1"}}}))
    return root


@pytest.fixture(scope="module")
def server(tiny_model: Path, served_root: Path) -> Iterator[str]:
    """A server of the bare tiny model that loads adapters at run time, as vLLM does."""
    app = create_app(LocalBackend.load(str(tiny_model)), served_name="tiny", adapters_dir=served_root,
                     allow_runtime_lora=True)
    with serve_app(app) as url:
        yield url


def _reply(url: str, model: str) -> str:
    answer = httpx.post(f"{url}/chat/completions", timeout=60, json={
        "model": model, "messages": [{"role": "user", "content": "I failed my exam again."}], "max_tokens": 8,
        "temperature": 0})
    assert answer.status_code == 200, answer.text
    return answer.json()["choices"][0]["message"]["content"]


def test_a_running_server_serves_the_roles_with_their_adapters_loaded_in_place(
        server: str, served_root: Path, tiny_model: Path, roster: Roster) -> None:
    policies = Policies.from_file(served_root / "policies.yaml", roster, seed=0)
    pool = VllmPool(attach={str(tiny_model): server})
    remote = pool.serve(policies)
    assert remote.spec("anchor").kind == "openai" and remote.spec("anchor").model == "anchor"
    assert remote.spec("anchor").urls == [server] and remote.spec("catalyst").model == "tiny"  # the base's name
    # no GPU here: a role without a timeout of its own waits as long as two cores may take
    assert remote.spec("anchor").timeout == vllm_pool.CPU_REQUEST_TIMEOUT
    assert "anchor" in {m["id"] for m in httpx.get(f"{server}/models").json()["data"]}
    # records say what the local policies would: base folder, adapter folder, version
    assert remote.record("anchor") == {"model": str(tiny_model), "adapter": "anchor", "adapter_version": "1"}
    bare = remote.without_adapters()  # the baselines of eval
    assert bare.spec("anchor").model == "tiny"
    assert bare.record("anchor") == {"model": str(tiny_model), "adapter": None, "adapter_version": None}
    before = _reply(server, "anchor")
    assert remote.chat_model("anchor").invoke([("user", "hello")], max_tokens=4).content is not None
    # a stage that trained a new version under the same name: the next pool loads it in place
    shutil.rmtree(served_root / "adapters" / "anchor")
    shutil.copytree(served_root / "adapters" / "catalyst", served_root / "adapters" / "anchor")
    VllmPool(attach={str(tiny_model): server}).serve(policies)
    after = _reply(server, "anchor")
    assert after != before and after == _reply_with_catalyst(server, served_root)
    pool.close()  # an attached server is never stopped
    assert httpx.get(f"{server}/models").status_code == 200


def _reply_with_catalyst(url: str, root: Path) -> str:
    loaded = httpx.post(f"{url}/load_lora_adapter", json={"lora_name": "catalyst-check",
                                                          "lora_path": str(root / "adapters" / "catalyst")})
    assert loaded.status_code == 200, loaded.text
    return _reply(url, "catalyst-check")


def test_a_refused_adapter_is_one_line(server: str, tiny_model: Path, roster: Roster, tmp_path: Path) -> None:
    outside = tmp_path / "outside"  # the local server only loads from its adapters folder
    shutil.copytree(tiny_model / "adapters" / "beacon", outside)
    policies = Policies({"default": PolicySpec(kind="local", model=str(tiny_model)),
                         "beacon": PolicySpec(kind="local", model=str(tiny_model), adapter=str(outside))}, roster)
    with pytest.raises(vllm_pool.PolicyError, match=r"refused adapter 'outside'.*400") as caught:
        VllmPool(attach={str(tiny_model): server}).serve(policies)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(("value", "message"), [("{not json", "not JSON"), ('["http://x/v1"]', "expected"),
                                                 ('{"m": 3}', "expected")])
def test_a_bad_servers_variable_is_one_line(value: str, message: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(VLLM_SERVERS_ENV, value)
    with pytest.raises(VllmError, match=message):
        attached_servers()


def test_a_command_uses_the_servers_it_is_given(server: str, served_root: Path, tiny_model: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """What a pipeline stage does: ``--engine vllm`` with ``$MASCOT_VLLM_SERVERS`` starts no
    engine, sends every role to the given server and records the local policies."""
    from mascot.training.episodes.episode import read_episodes

    monkeypatch.setenv(VLLM_SERVERS_ENV, json.dumps({str(tiny_model): server}))
    monkeypatch.setattr(vllm_pool.VllmServer, "start", lambda self: pytest.fail("an engine was started"))
    out = tmp_path / "episodes.jsonl"
    assert main(["rollout", "--roster", "emotional_support", "--policies", str(served_root / "policies.yaml"),
                 "--engine", "vllm", "--episodes", "2", "--max-rounds", "1", "--max-tokens", "8",
                 "--out", str(out)]) == 0, capsys.readouterr().err[-2000:]
    episodes = read_episodes(out)
    assert len(episodes) == 2
    assert {e.policies["anchor"].adapter for e in episodes} == {"anchor"}
    assert {e.policies["director"].model for e in episodes} == {str(tiny_model)}


class _FakeServer:
    """Stands in for a vLLM process: counts starts and stops."""

    started: ClassVar[list[str]] = []
    stopped: ClassVar[list[str]] = []
    made: ClassVar[list[_FakeServer]] = []

    def __init__(self, served: object, **kwargs: object) -> None:
        self.base = served.base  # type: ignore[attr-defined]
        self.kwargs = kwargs
        self.served_name = Path(self.base).name
        self.url = f"http://127.0.0.1:1/{len(_FakeServer.started)}/v1"
        self.started_in = 0.0
        _FakeServer.made.append(self)

    def start(self) -> _FakeServer:
        _FakeServer.started.append(self.base)
        return self

    def stop(self) -> None:
        _FakeServer.stopped.append(self.base)

    def memory(self) -> int:
        return 0


def test_the_pipeline_runs_the_servers_each_stage_uses_and_none_while_it_trains(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mascot.cli import pipeline_run
    from mascot.cli.pipeline import demo_recipe

    _FakeServer.started, _FakeServer.stopped, _FakeServer.made = [], [], []
    monkeypatch.setattr(vllm_pool, "VllmServer", _FakeServer)
    monkeypatch.setattr(pipeline_run, "check_extras", lambda: None)
    calls: list[tuple[list[str], dict | None, list[str]]] = []

    def running() -> list[str]:
        up = list(_FakeServer.started)
        for base in _FakeServer.stopped:
            up.remove(base)
        return sorted(up)

    def run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess:
        calls.append((argv[3:], kwargs.get("env"), running()))  # type: ignore[arg-type]
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(pipeline_run.subprocess, "run", run)
    (tmp_path / "model").mkdir()
    recipe = {**demo_recipe("model", judge_url=None), "engine": "vllm",
              "judge": {"model": "judge/model", "block_turns": 2}}
    recipe["speakers"]["flags"] += ["--lora_r", "32"]
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    stages: list[tuple[str, str]] = []
    pipeline_run.run_pipeline(tmp_path / "recipe.yaml", on_stage=lambda name, state: stages.append((name, state)))
    model, judge = str(tmp_path / "model"), "judge/model"
    # the policy model's stages, the judge's, training with no server, the Director, eval with both
    assert _FakeServer.started == [model, judge, model, judge]
    assert sorted(_FakeServer.stopped) == sorted(_FakeServer.started)  # all stopped when the pipeline ends
    for argv, env, up in calls:
        if "--engine" not in argv:
            assert env is None and up == [], argv[0]  # a training stage has the machine's memory
            continue
        uses = {"judge": [judge], "eval": sorted([model, judge])}.get(argv[0], [model])
        assert sorted(json.loads(env[VLLM_SERVERS_ENV])) == uses == up, argv[0]
    assert {argv[0] for argv, env, _ in calls if env is None} >= {"train-speakers", "train-rm"}
    assert "train-director" in {argv[0] for argv, env, _ in calls if env is not None}  # its blocks on the servers
    assert next(state for name, state in stages if name == "engine").startswith("starting vLLM for")
    assert any(state.startswith("stopping vLLM for") for name, state in stages if name == "engine")
    # runtime LoRA on, for the training stages' largest rank (--lora_r 32)
    assert all(s.kwargs["allow_runtime_lora"] and s.kwargs["lora_rank"] == 32 for s in _FakeServer.made)


def test_one_pool_serves_one_folder_per_adapter_name(server: str, served_root: Path, tiny_model: Path,
                                                     roster: Roster, tmp_path: Path) -> None:
    """Two policy sets of one command (eval's trained and warm-start systems) with different
    folders of one name: the second is served under its parent folder's name, so neither
    swaps the weights under the other's roles."""
    pool = VllmPool(attach={str(tiny_model): server})
    first = pool.serve(Policies.from_file(served_root / "policies.yaml", roster, seed=0))
    other = served_root / "elsewhere" / "anchor"
    shutil.copytree(served_root / "adapters" / "catalyst", other)
    rival = Policies({"default": PolicySpec(kind="local", model=str(tiny_model)),
                      "judge": PolicySpec(kind="local", model=str(tiny_model), adapter=str(other))}, roster)
    second = pool.serve(rival)
    assert first.spec("anchor").model == "anchor" and second.spec("judge").model == "elsewhere-anchor"
    again = pool.serve(Policies.from_file(served_root / "policies.yaml", roster, seed=0))
    assert again.spec("anchor").model == "anchor"  # the same folder keeps its name


def test_a_server_is_found_by_the_folder_whatever_the_path_says(tiny_model: Path, tmp_path: Path) -> None:
    link = tmp_path / "model-link"
    link.symlink_to(tiny_model)
    pool = VllmPool(attach={str(link): "http://127.0.0.1:9/v1"})
    assert pool.url(str(tiny_model)) == pool.url(str(tiny_model / ".." / tiny_model.name)) == "http://127.0.0.1:9/v1"
