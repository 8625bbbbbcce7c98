"""vLLM for real on this CPU: one `mascot serve --engine vllm` of the offline model with two adapters
trained here, then `rollout --engine vllm`. Skipped without the offline model or `.venv-vllm`
(`scripts/install --vllm`); `.ci/run` has both."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from memory import trim_memory

from mascot.cli import main
from mascot.policies.vllm import VllmError, vllm_python
from mascot.rosters import Roster

pytestmark = [pytest.mark.vllm, pytest.mark.real_model]

MASCOT = str(Path(sys.executable).parent / "mascot")
MESSAGE = "I failed my driving test again and I feel like an idiot"


def _engine() -> str | None:
    try:
        return vllm_python()
    except VllmError:
        return None


needs_vllm = pytest.mark.skipif(_engine() is None, reason="no vLLM environment: run scripts/install --vllm")


@pytest.fixture(scope="module")
def policy_file(offline_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two adapters of the offline model: the Anchor's trained here by DPO (two steps towards
    warm replies), the Catalyst's the speakers' adapter the package ships for this model
    (``mascot.trained``; ``mascot offline-model`` copies it beside the model), so that one
    training on the 0.5B is enough."""
    from mascot.trained import SHIPPED
    from mascot.training.fitting.speaker_dpo import train_speaker_dpo

    root = tmp_path_factory.mktemp("vllm")
    prompts = [[{"role": "user", "content": text}] for text in
               (MESSAGE, "My boss shouted at me today.", "I can't sleep before exams.", "My sister won't call me.")]
    chosen, rejected = "That sounds really painful, and it makes sense to feel hurt.", "What do you want to do?"
    pairs = [{"prompt": p, "chosen": [{"role": "assistant", "content": chosen}],
              "rejected": [{"role": "assistant", "content": rejected}]} for p in prompts]
    train_speaker_dpo(pairs, base=str(offline_model), persona="anchor", out=root / "adapters", config={
        "lora_r": 8, "lora_alpha": 16, "training": {"max_steps": 2, "learning_rate": 3e-3,
                                                    "per_device_train_batch_size": 4, "disable_tqdm": True}})
    shutil.copytree(SHIPPED / offline_model.name / "speakers", root / "adapters" / "catalyst")
    trim_memory()  # the engines to come need the room
    path = root / "policies.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "defaults": {"kind": "local", "model": str(offline_model)},
                                    "roles": {"default": {}, "anchor": {"adapter": "adapters/anchor"},
                                              "catalyst": {"adapter": "adapters/catalyst"}}}))
    return path


@pytest.fixture(scope="module")
def served(policy_file: Path) -> Iterator[tuple[subprocess.Popen, str, Path]]:
    """`mascot serve --engine vllm` in its own process: (process, URL, its stderr file); the
    client policy file it writes is ``client.yaml`` beside the policy file."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client, log = policy_file.parent / "client.yaml", policy_file.parent / "serve.log"
    with log.open("w") as stderr:  # a file: vLLM's log would fill a pipe nobody reads and stall it
        process = subprocess.Popen([MASCOT, "serve", "--engine", "vllm", "--policies", str(policy_file), "--port",
                                    str(port), "--allow-runtime-lora", "--client-policies", str(client)],
                                   stdout=subprocess.DEVNULL, stderr=stderr, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if httpx.get(f"{url}/models", timeout=5).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(2)
    assert process.poll() is None, log.read_text()[-3000:]
    yield process, url, log
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=120)


def _complete(url: str, model: str, **kwargs: object) -> str:
    from openai import OpenAI

    reply = OpenAI(base_url=url, api_key="EMPTY").chat.completions.create(
        model=model, messages=[{"role": "user", "content": MESSAGE}], max_tokens=24, temperature=0, **kwargs)
    return reply.choices[0].message.content or ""


@needs_vllm
@pytest.mark.timeout(600)  # the module's adapter training (its fixture) counts here, then an engine's start
def test_rollout_on_vllm_writes_the_local_records(policy_file: Path, roster: Roster, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """First in the module, before ``served`` starts: two engines of the 0.5B in fp32 (about
    6 GiB each on a CPU) beside this process do not fit a 24 GiB machine."""
    from mascot.training.episodes.episode import Episode, read_episodes

    out = tmp_path / "episodes.jsonl"
    before = {pid for pid, line in _processes(with_pid=True) if "vllm.entrypoints" in line}
    assert main(["rollout", "--roster", "emotional_support", "--policies", str(policy_file), "--engine", "vllm",
                 "--episodes", "2", "--max-rounds", "1", "--max-tokens", "speakers=48", "--concurrency", "2",
                 "--seed", "0", "--out", str(out)]) == 0, capsys.readouterr().err[-3000:]
    episodes = read_episodes(out)
    assert len(episodes) == 2
    for episode in episodes:
        record = json.loads(episode.model_dump_json())
        assert set(record) == set(Episode.model_fields)  # the reader's own format, field for field
        assert episode.policies["anchor"].adapter == "anchor"  # recorded as the local policy
        assert episode.policies["director"].adapter is None
        voices = [m.content for m in episode.messages if m.name in roster.persona_ids]
        assert voices and len(set(voices)) == len(voices), voices  # per-call seeds: no groupthink by seeding
    after = {pid for pid, line in _processes(with_pid=True) if "vllm.entrypoints" in line}
    assert after == before  # the stage's own server is gone, and nothing else was stopped


@needs_vllm
def test_each_adapter_answers_with_its_own_weights(served: tuple) -> None:
    from langchain_openai import ChatOpenAI

    _, url, _ = served
    names = {m["id"] for m in httpx.get(f"{url}/models").json()["data"]}
    assert names == {"qwen2.5-coder-0.5b-instruct", "anchor", "catalyst"}  # the base under its folder's name
    replies = {name: _complete(url, name) for name in sorted(names)}
    print(replies)
    assert len(set(replies.values())) == 3, replies
    langchain = ChatOpenAI(base_url=url, api_key="EMPTY", model="anchor", temperature=0, max_tokens=24)
    assert langchain.invoke([("user", MESSAGE)]).content == replies["anchor"]


@needs_vllm
def test_streaming_gives_the_same_reply(served: tuple) -> None:
    from openai import OpenAI

    _, url, _ = served
    stream = OpenAI(base_url=url, api_key="EMPTY").chat.completions.create(
        model="catalyst", messages=[{"role": "user", "content": MESSAGE}], max_tokens=24, temperature=0, stream=True)
    chunks = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert len(chunks) > 2 and "".join(chunks) == _complete(url, "catalyst")


@needs_vllm
def test_a_directed_round_through_the_server(served: tuple, policy_file: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    client = policy_file.parent / "client.yaml"
    assert main(["chat", "--roster", "emotional_support", "--policies", str(client), "--message", MESSAGE,
                 "--max-rounds", "1", "--seed", "0", "--json"]) == 0
    episode = json.loads(capsys.readouterr().out)
    asked = [d for d in episode["directions"] if d.get("rationale") != "turn limit of the round reached"]
    assert asked and not [d for d in asked if d.get("fallback")], episode["directions"]  # JSON-schema directions
    replies = [m for m in episode["messages"] if m["role"] == "assistant"]
    assert replies and all(m["content"].strip() for m in replies)
    assert len({m["content"] for m in replies}) == len(replies)  # no two voices with the same reply


@needs_vllm
def test_runtime_adapters_and_reload(served: tuple, policy_file: Path) -> None:
    _, url, _ = served
    adapter = str(policy_file.parent / "adapters" / "anchor")
    loaded = httpx.post(f"{url}/load_lora_adapter", json={"lora_name": "anchor-2", "lora_path": adapter}, timeout=120)
    assert loaded.status_code == 200, loaded.text
    assert "anchor-2" in {m["id"] for m in httpx.get(f"{url}/models").json()["data"]}
    assert _complete(url, "anchor-2") == _complete(url, "anchor")
    assert httpx.post(f"{url}/unload_lora_adapter", json={"lora_name": "anchor-2"}, timeout=60).status_code == 200
    reload = subprocess.run([MASCOT, "serve", "--reload", "--policies", str(policy_file), "--url", url],
                            capture_output=True, text=True, timeout=300)
    assert reload.returncode == 0 and "reloaded anchor, catalyst" in reload.stdout, reload.stderr[-2000:]
    # what a pipeline stage does with the pipeline's server: the adapters it needs, loaded in place
    from mascot.policies import Policies
    from mascot.policies.vllm import VllmPool
    from mascot.rosters import load_roster

    policies = Policies.from_file(policy_file, load_roster("emotional_support"), seed=0)
    remote = VllmPool(attach={policies.spec("default").model: url}).serve(policies)
    assert remote.spec("anchor").model == "anchor" and remote.spec("catalyst").model == "catalyst"
    assert remote.chat_model("anchor").invoke([("user", MESSAGE)]).content.strip()
    # a bad adapter path is refused and the engine keeps serving
    bad = httpx.post(f"{url}/load_lora_adapter", json={"lora_name": "bad", "lora_path": "/no/such/adapter"},
                     timeout=60)
    assert 400 <= bad.status_code < 500, bad.text
    assert _complete(url, "anchor")


@needs_vllm
def test_director_grpo_step_samples_and_plays_on_the_server(served: tuple, policy_file: Path, offline_model: Path,
                                                            roster: Roster, tmp_path: Path) -> None:
    """One Director GRPO step whose directions are sampled on vLLM (n, logprobs, token ids) and
    whose blocks the speakers play there: the step's adapter is loaded in place and answers."""
    from langchain_core.messages import HumanMessage

    from mascot.graphs.prompts import director_messages
    from mascot.messages import chat_messages
    from mascot.policies import Policies
    from mascot.policies.local.precision import cpu_has_native_bf16
    from mascot.training.data.block_rollout import BlockRollout, DecisionPoint
    from mascot.training.fitting.director_rollout import ADAPTER_NAME, DirectorRollout
    from mascot.training.fitting.director_training import train_director

    _, url, _ = served
    base = next(m["id"] for m in httpx.get(f"{url}/models", timeout=30).json()["data"] if not m.get("parent"))
    points = [DecisionPoint(context_id=f"p{i}", episode_id=f"e{i}", cut=1, messages=(HumanMessage(text),), round=0,
                            round_turns=0, scenario=None, user_profile=None, prompt=tuple(chat_messages(
                                director_messages(roster, [HumanMessage(text)], round_turns=0,
                                                  max_speakers_per_round=3, min_speakers_per_round=1))))
              for i, text in enumerate((MESSAGE, "My boss shouted at me in front of everyone today."))]
    speakers = Policies.from_file(policy_file.parent / "client.yaml", roster)
    blocks = BlockRollout(roster, speakers=speakers.speakers(), director=speakers.chat_model("director"), user=None,
                          block_turns=1)
    played: list = []
    rollout = DirectorRollout(points, blocks, url=url, served_name=base, adapters_dir=tmp_path / "served")
    call = rollout.__call__
    report = train_director(points, base=str(offline_model), out=tmp_path, rollout=blocks, group_rm=None,
                            rollout_func=lambda prompts, trainer: played.append(out := call(prompts, trainer)) or out,
                            config={"lora_r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "lora_layer_share": 0.5,
                                    "lora_target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
                                    "group_rm_weight": 0.0, "block_turns": 1, "training": {
                                        "max_steps": 1, "num_generations": 2, "per_device_train_batch_size": 4,
                                        "max_completion_length": 64, "bf16": cpu_has_native_bf16(),
                                        "disable_tqdm": True}})
    blocks.close()
    assert report.steps == 1 and len(played) == 1
    batch = played[0]
    assert len(batch["completion_ids"]) == 4 and all(len(c) == len(lp) for c, lp in
                                                     zip(batch["completion_ids"], batch["logprobs"], strict=True))
    assert all(b.turns and b.turns[0]["content"].strip() for b in batch["block"])  # each direction was played
    assert ADAPTER_NAME in {m["id"] for m in httpx.get(f"{url}/models", timeout=30).json()["data"]}
    assert (tmp_path / "director" / "adapter_model.safetensors").is_file()


@needs_vllm
def test_a_killed_engine_is_one_line_and_leaves_nothing(served: tuple) -> None:
    process, _, log = served
    engine = [int(pid) for pid, line in _processes(with_pid=True) if "vllm.entrypoints" in line]
    assert engine
    for pid in engine:
        os.kill(pid, signal.SIGKILL)
    code = process.wait(timeout=120)
    errors = [line for line in log.read_text().splitlines() if line.startswith("mascot: error:")]
    assert code == 1 and len(errors) == 1 and "vLLM exited with code" in errors[0], errors
    time.sleep(2)
    assert not [line for line in _processes() if "vllm" in line.lower() and "pytest" not in line]


def _processes(with_pid: bool = False) -> list:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if line:
                found.append((entry.name, line) if with_pid else line)
    return found
