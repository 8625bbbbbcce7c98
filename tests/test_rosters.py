from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mascot.cli import main
from mascot.rosters import RosterError, list_rosters, load_roster, load_scenarios, roster_path


@pytest.mark.parametrize("roster_id", ["emotional_support", "workplace_meeting"])
def test_shipped_rosters_are_complete(roster_id: str) -> None:
    roster = load_roster(roster_id)
    scenarios = load_scenarios(roster_id)
    assert roster.id == roster_id
    assert len(roster.personas) >= 4
    assert len(roster.user_profiles) >= 8
    assert len(scenarios) >= 30
    assert {s.valence for s in scenarios} == {"negative", "mixed", "positive"}
    assert {s.difficulty for s in scenarios} == {"easy", "medium", "hard"}
    # complementary voices: no two personas share a role label or a persona text
    assert len({p.role for p in roster.personas}) == len(roster.personas)


def test_emotional_support_personas() -> None:
    roster = load_roster("emotional_support")
    assert roster.persona_ids == ["anchor", "catalyst", "beacon", "action_guide"]
    assert any("solution" in b.lower() or "advice" in b.lower() for b in roster.persona("anchor").boundaries)


def test_list_rosters() -> None:
    assert list_rosters() == ["emotional_support", "workplace_meeting"]


def _write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "roster.yaml"
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return path


def _valid() -> dict:
    return yaml.safe_load(roster_path("emotional_support").read_text())


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: d["personas"].__setitem__(1, {**d["personas"][1], "id": "anchor"}), "duplicate persona id: anchor"),
        (lambda d: d["personas"][0].__setitem__("persona", ""), "personas.0.persona"),
        (lambda d: d["personas"][0].__setitem__("mood", "x"), "unknown field (valid fields: boundaries, goals, id, name, persona, role, style)"),
        (lambda d: d["personas"][0].__setitem__("id", "user"), "reserved"),
        (lambda d: d.__setitem__("personas", d["personas"][:1]), "field 'personas'"),
        (lambda d: d["user_profiles"][0]["ocean"].__setitem__("openness", 7), "user_profiles.0.ocean.openness"),
        (lambda d: d.pop("director"), "field 'director': Field required"),
    ],
)
def test_invalid_roster_gets_one_clear_line(tmp_path: Path, mutate, expected: str) -> None:
    data = _valid()
    mutate(data)
    path = _write(tmp_path, data)
    with pytest.raises(RosterError) as info:
        load_roster(path)
    message = str(info.value)
    assert "\n" not in message
    assert str(path) in message
    assert expected in message


def test_malformed_yaml_names_the_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "id: x\npersonas: [\n  - : :\n")
    with pytest.raises(RosterError, match=r"roster.yaml:\d+: malformed YAML"):
        load_roster(path)


def test_unknown_roster_lists_shipped_ones() -> None:
    with pytest.raises(RosterError, match="emotional_support, workplace_meeting"):
        load_roster("no_such_roster")


def test_bad_scenario_line(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    good = load_scenarios("emotional_support")[0].model_dump_json()
    path.write_text(good + "\n{not json\n")
    with pytest.raises(RosterError, match=r"s.jsonl:2: not valid JSON"):
        load_scenarios(path)
    path.write_text(good + "\n" + good + "\n")
    with pytest.raises(RosterError, match="duplicate scenario id"):
        load_scenarios(path)


def test_cli_rosters(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rosters"]) == 0
    assert "workplace_meeting" in capsys.readouterr().out
    assert main(["rosters", "show", "workplace_meeting"]) == 0
    assert "risk_owner" in capsys.readouterr().out
    assert main(["rosters", "check", str(roster_path("emotional_support"))]) == 0
    assert "OK" in capsys.readouterr().out
    data = _valid()
    data["personas"][1]["id"] = "anchor"
    assert main(["rosters", "check", str(_write(tmp_path, data))]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "duplicate persona id" in captured.err
    assert "Traceback" not in captured.err
