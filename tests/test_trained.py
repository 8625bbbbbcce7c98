"""The trained adapters that ship with the package, and the policies file that plays them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mascot.offline.model import DEFAULT_OFFLINE_MODEL
from mascot.policies.spec import load_policy_specs
from mascot.rosters import load_roster
from mascot.trained import ADAPTER_FILES, ROLES, TrainedError, ship, shipped_run, write_trained_policies


def _adapters(folder: Path) -> Path:
    for role in ROLES:
        (folder / role).mkdir(parents=True)
        for name in ADAPTER_FILES:
            (folder / role / name).write_text(json.dumps({"base_model_name_or_path": "/somewhere/else", "r": 8}))
    return folder


def test_a_run_ships_and_the_model_folder_gets_a_policies_file_that_plays_it(tmp_path: Path) -> None:
    roster = load_roster("emotional_support")
    run = {"roster": roster.id, "personas": list(roster.persona_ids), "version": "v1", "report": "docs/learning"}
    target = ship(_adapters(tmp_path / "run" / "adapters"), "some-model", run, into=tmp_path / "shipped")
    assert shipped_run("some-model", shipped=tmp_path / "shipped") == run
    config = json.loads((target / "director" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "some-model" and config["r"] == 8  # no path of the training machine
    model = tmp_path / "model"
    model.mkdir()
    policies = write_trained_policies(model, "some-model", shipped=tmp_path / "shipped")
    assert policies == model.resolve() / "policies.yaml"
    specs = load_policy_specs(policies, None)
    for persona in roster.persona_ids:
        assert specs[persona].adapter == str(model.resolve() / "adapters" / "speakers")
    assert specs["director"].adapter == str(model.resolve() / "adapters" / "director")
    assert specs["default"].adapter is None and specs["default"].model == str(model.resolve())
    assert all((Path(specs["director"].adapter) / name).is_file() for name in ADAPTER_FILES)
    # nothing ships for another model; an unfinished adapter does not ship
    assert write_trained_policies(model, "other-model", shipped=tmp_path / "shipped") is None
    (tmp_path / "run" / "adapters" / "director" / "adapter_model.safetensors").unlink()
    with pytest.raises(TrainedError, match="no adapter_model.safetensors"):
        ship(tmp_path / "run" / "adapters", "some-model", run, into=tmp_path / "again")


def test_the_package_ships_the_learning_runs_adapters_for_the_default_offline_model() -> None:
    run = shipped_run(DEFAULT_OFFLINE_MODEL)
    assert run is not None, "bench/learning.py ships them into mascot/trained"
    roster = load_roster(run["roster"])
    assert set(run["personas"]) == set(roster.persona_ids)
    # the run that shipped them is on record: its report, its adapters' version and its machine
    assert (Path(__file__).parents[1] / run["report"]).is_file() and run["version"] and run["machine"]
    pyproject = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    assert '"mascot.trained" = [' in pyproject and "adapter_model.safetensors" in pyproject

@pytest.mark.real_model
def test_the_shipped_ensemble_plays_a_round_on_the_offline_model(offline_model: Path, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from mascot.cli import main

    folder = tmp_path / "model"
    folder.mkdir()
    for name in offline_model.iterdir():  # the model's files, beside which the adapters are written
        (folder / name.name).symlink_to(name)
    watched = [offline_model / "policies.yaml", *sorted((offline_model / "adapters").rglob("*"))]
    before = {name: name.read_bytes() for name in watched if name.is_file()}
    policies = write_trained_policies(folder, DEFAULT_OFFLINE_MODEL)
    assert policies is not None and not policies.is_symlink() and not (folder / "adapters").is_symlink()
    assert {name: name.read_bytes() for name in before} == before  # the linked model folder is left as it was
    code = main(["chat", "--roster", "emotional_support", "--policies", str(policies), "--message",
                 "I failed my driving test again and I feel like an idiot", "--max-rounds", "1", "--seed", "0",
                 "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err[-2000:]
    episode = json.loads(captured.out)
    played = episode["policies"]
    assert "+ director" in played["director"] and "+ speakers" in played["anchor"]  # the shipped adapters played
    replies = [m for m in episode["messages"] if m["role"] == "assistant" and m.get("name")]
    assert replies and all(m["content"].strip() for m in replies)
    assert not [d for d in episode["directions"] if d.get("fallback") and "limit" not in str(d.get("rationale"))]
