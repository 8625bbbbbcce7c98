from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mascot.cli import main
from mascot.rosters import (
    RESERVED_IDS,
    USER,
    DirectorGuidance,
    Ocean,
    Persona,
    Roster,
    RosterError,
    Scenario,
    UserProfile,
    list_rosters,
    load_roster,
    load_scenarios,
    roster_path,
    scaffold_roster,
    schema_reference,
)
from mascot.rosters.reference import END, START, field_summary
from mascot.rosters.scaffold import placeholder_roster, placeholder_scenarios


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
        (lambda d: d["personas"][0].__setitem__("mood", "x"),
         "unknown field (valid fields: boundaries, goals, id, name, persona, role, style)"),
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


# --- every problem, reserved ids, missing scenarios ---------------------------------------

ROOT = Path(__file__).resolve().parents[1]
STUDY_GROUP = ROOT / "tests" / "data" / "study_group"


def _three_mistakes() -> dict:
    data = _valid()
    data["version"] = "one"  # not a whole number
    data["user_profiles"][0]["openness"] = 0.5  # belongs under ocean
    data["personas"][1]["persona"] = "too short"
    return data


def test_every_problem_is_listed(tmp_path: Path) -> None:
    path = _write(tmp_path, _three_mistakes())
    with pytest.raises(RosterError) as info:
        load_roster(path)
    error = info.value
    assert error.summary == f"{path}: 3 problems:"
    assert [p.split(":")[0] for p in error.problems] == [
        "field 'version'", "field 'personas.1.persona'", "field 'user_profiles.0.openness'"]
    assert "(got 'one')" in error.problems[0]
    assert "'openness' is a field of 'ocean'" in error.problems[2]
    assert str(error).splitlines() == [error.summary, *(f"  {p}" for p in error.problems)]


def test_cli_prints_every_problem_on_its_own_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, _three_mistakes())
    assert main(["rosters", "check", str(path)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == f"mascot: error: {path}: 3 problems:"
    assert len(lines) == 4 and all(line.startswith("  field '") for line in lines[1:])
    assert "Traceback" not in "\n".join(lines)


def test_control_characters_stay_escaped_within_a_problem(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    data = _valid()
    data["personas"][0]["bad\nkey"] = 1
    data["version"] = 0
    assert main(["rosters", "check", str(_write(tmp_path, data))]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3 and "bad\\nkey" in lines[2]


def test_every_bad_scenario_line_is_listed(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    good = load_scenarios("emotional_support")[0].model_dump()
    lines = [json.dumps(good), "{not json", json.dumps({**good, "id": "b", "valence": "sad"}), json.dumps(good)]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(RosterError) as info:
        load_scenarios(path)
    assert info.value.problems == (
        "line 2: not valid JSON at column 2 (Expecting property name enclosed in double quotes)",
        "line 3: field 'valence': Input should be 'negative', 'mixed' or 'positive' (got 'sad')",
        f"line 4: duplicate scenario id '{good['id']}' (first on line 1)",
    )


@pytest.mark.parametrize(("persona_id", "reason"), [
    ("director", "'director' is reserved: it names the Director's node in the graph"),
    ("assistant", "'assistant' is reserved: it names the single baseline's assistant node in the graph"),
    ("user", "'user' is reserved: it names the person's turn in the graph"),
    ("speakers", "'speakers' is reserved: it names every persona at once in the CLI's `--max-tokens speakers=N`"),
])
def test_reserved_persona_ids_are_refused_with_the_reason(persona_id: str, reason: str, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    data = _valid()
    data["personas"][0]["id"] = persona_id
    assert main(["rosters", "check", str(_write(tmp_path, data))]) == 2
    stderr = capsys.readouterr().err
    assert stderr.count("\n") == 1 and reason in stderr and "Traceback" not in stderr


def test_reserved_ids_cover_every_node_of_every_graph() -> None:
    """Every node of the director graph and of each baseline is a persona or reserved, and
    every fixed policy role is reserved: a persona id cannot collide with either."""
    from langchain_core.language_models.fake_chat_models import FakeListChatModel
    from langgraph.graph import END, START

    from mascot.graphs import BASELINES, create_baseline_graph, create_director_graph
    from mascot.policies import FIXED_ROLES

    roster = load_roster(STUDY_GROUP)
    model = FakeListChatModel(responses=[""])
    builders = {"director": create_director_graph(roster, director=model, speakers=model, user="human")}
    builders |= {kind: create_baseline_graph(kind, roster, speakers=model, user="human") for kind in BASELINES}
    allowed = {*roster.persona_ids, *RESERVED_IDS, START, END}
    for kind, builder in builders.items():
        nodes = set(builder.compile().get_graph().nodes)
        assert nodes <= allowed, f"{kind} graph: nodes {sorted(nodes - allowed)} are neither personas nor in " \
                                 "mascot.rosters.RESERVED_IDS; reserve them in rosters/models.py"
    assert set(FIXED_ROLES) <= set(RESERVED_IDS)
    assert USER in RESERVED_IDS


def test_check_warns_when_the_scenarios_are_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, _valid())
    assert main(["rosters", "check", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith(f"{path}: OK")
    assert captured.err.splitlines() == [
        f"mascot: warning: no scenario file at {tmp_path / 'scenarios.jsonl'}: chat works without it; "
        "rollout needs it there or --scenarios FILE.jsonl"]


def test_rollout_names_the_scenario_file_it_looked_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    _write(tmp_path, _valid())
    monkeypatch.chdir(tmp_path)
    assert main(["rollout", "--roster", ".", "--model", "m", "--episodes", "1", "--out", "e.jsonl"]) == 2
    stderr = capsys.readouterr().err
    assert stderr.splitlines() == [
        f"mascot: error: no scenario file at {tmp_path / 'scenarios.jsonl'} (rollout reads scenarios.jsonl "
        "beside the roster's roster.yaml): write one there, or pass --scenarios FILE.jsonl"]


def test_eval_names_the_scenario_file_it_looked_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    _write(tmp_path, _valid())
    (tmp_path / "policies.yaml").write_text(
        "version: 1\nroles:\n  default: {kind: openai, base_url: 'http://127.0.0.1:9/v1', model: m}\n")
    monkeypatch.chdir(tmp_path)
    assert main(["eval", "--roster", ".", "--policies", "policies.yaml", "--judge-model", "m",
                 "--judge-base-url", "http://127.0.0.1:9/v1", "--out", "ev"]) == 2
    stderr = capsys.readouterr().err
    assert stderr.splitlines() == [
        f"mascot: error: no scenario file at {tmp_path / 'scenarios.jsonl'} (eval reads scenarios.jsonl "
        "beside the roster's roster.yaml): write one there, or pass --scenarios FILE.jsonl"]


def test_duplicates_are_listed_with_the_other_problems(tmp_path: Path) -> None:
    data = _three_mistakes()
    data["personas"][2]["id"] = data["personas"][0]["id"]
    data["user_profiles"].append(dict(data["user_profiles"][1]))
    path = _write(tmp_path, data)
    with pytest.raises(RosterError) as info:
        load_roster(path)
    assert [p.split(":")[0] for p in info.value.problems] == [
        "field 'version'", "field 'personas.1.persona'", "field 'personas'", "field 'user_profiles.0.openness'",
        "field 'user_profiles'"]
    assert info.value.problems[2] == f"field 'personas': duplicate persona id: {data['personas'][0]['id']}"
    assert (info.value.problems[4]
            == f"field 'user_profiles': duplicate user profile id: {data['user_profiles'][1]['id']}")
    assert info.value.summary == f"{path}: 5 problems:"


def test_a_roster_path_that_is_no_regular_file_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "empty").mkdir()
    for path in ("/dev/zero", str(fifo), str(tmp_path / "empty")):
        with pytest.raises(RosterError) as info:
            load_roster(path)
        assert "\n" not in str(info.value) and "no such file" in str(info.value)
        with pytest.raises(RosterError, match="no such scenario file"):
            load_scenarios(path if path != str(tmp_path / "empty") else tmp_path / "empty" / "x.jsonl")


def test_a_json_error_keeps_its_whole_reason_and_column(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    good = load_scenarios("emotional_support")[0].model_dump_json()
    path.write_text(good + '\n{"id": "abc\n')
    with pytest.raises(RosterError) as info:
        load_scenarios(path)
    assert str(info.value) == f"{path}:2: not valid JSON at column 8 (Unterminated string starting at)"


def test_roster_error_pickles_with_its_problems(tmp_path: Path) -> None:
    with pytest.raises(RosterError) as info:
        load_roster(_write(tmp_path, _three_mistakes()))
    copy = pickle.loads(pickle.dumps(info.value))
    assert (copy.summary, copy.problems, str(copy)) == (info.value.summary, info.value.problems, str(info.value))


# --- the schema reference, the scaffold, a roster written from the reference ------------------

def test_docs_hold_the_generated_schema_reference() -> None:
    page = (ROOT / "docs" / "rosters.md").read_text(encoding="utf-8")
    assert page.count(START) == 1 and page.count(END) == 1, f"docs/rosters.md needs {START} ... {END}"
    written = page.split(START)[1].split(END)[0]
    assert written == "\n" + schema_reference(), \
        "docs/rosters.md's roster schema reference is out of date: run `mascot rosters schema --write docs/rosters.md`"


def test_schema_reference_documents_every_field_and_rule() -> None:
    text = schema_reference()
    for model in (Roster, Persona, DirectorGuidance, UserProfile, Ocean, Scenario):
        assert f"#### {model.__name__}" in text
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no description"
            assert f"| `{name}` |" in text
    for rule in ("2–12 items", "40–4000 characters", "at least 1", "from 0.0 to 1.0",
                 "matches `^[a-z][a-z0-9_]{0,39}$`", "one of `negative`, `mixed`, `positive`",
                 "one of `easy`, `medium`, `hard`", "`director`"):
        assert rule in text


def test_rosters_schema_write_replaces_only_the_marked_text(tmp_path: Path) -> None:
    document = tmp_path / "README.md"
    document.write_text(f"# Title\n\nbefore\n{START}\nstale\n{END}\nafter\n")
    assert main(["rosters", "schema", "--write", str(document)]) == 0
    assert document.read_text() == f"# Title\n\nbefore\n{START}\n{schema_reference()}{END}\nafter\n"
    document.write_text("no markers\n")
    assert main(["rosters", "schema", "--write", str(document)]) == 2


def test_new_roster_passes_check_and_loads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "study"
    assert main(["rosters", "new", "study_group", "--out", str(folder)]) == 0
    assert sorted(p.name for p in folder.iterdir()) == ["roster.yaml", "scenarios.jsonl"]
    capsys.readouterr()
    assert main(["rosters", "check", str(folder)]) == 0
    captured = capsys.readouterr()
    assert "OK, roster 'study_group' with 2 personas, 1 user profiles, 3 scenarios" in captured.out
    assert captured.err == ""
    assert load_roster(folder) == placeholder_roster("study_group")
    assert load_scenarios(folder) == placeholder_scenarios()
    lines = (folder / "roster.yaml").read_text().splitlines()
    comments = " ".join(line.strip().removeprefix("#").strip() for line in lines if line.lstrip().startswith("#"))
    for model in (Roster, Persona, DirectorGuidance, UserProfile, Ocean, Scenario):
        for name in model.model_fields:  # every field explained in a comment
            assert field_summary(model, name) in comments, f"{model.__name__}.{name}"


@pytest.mark.parametrize(("args", "expected"), [
    (["study_group"], "folder exists and is not empty"),
    (["Study"], "roster id 'Study' is not valid"),
])
def test_new_roster_refuses(args: list[str], expected: str, tmp_path: Path,
                            capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    assert main(["rosters", "new", *args, "--out", str(tmp_path)]) == 2
    stderr = capsys.readouterr().err
    assert stderr.count("\n") == 1 and expected in stderr
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


def test_chat_runs_on_a_new_roster(tiny_model: Path, tmp_path: Path) -> None:
    folder = tmp_path / "study"
    scaffold_roster("study_group", folder)
    result = subprocess.run(
        [str(Path(sys.executable).parent / "mascot"), "chat", "--roster", str(folder), "--model", str(tiny_model),
         "--message", "I have an exam on Friday", "--max-rounds", "1", "--seed", "1", "--max-tokens", "16",
         "--json"],
        capture_output=True, text=True, timeout=180, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr
    episode = json.loads(result.stdout)
    assert episode["roster"] == "study_group"
    assert {m["name"] for m in episode["messages"] if m["role"] == "assistant"} <= {"supporter", "challenger"}


def test_roster_written_from_the_reference_passes_check(capsys: pytest.CaptureFixture[str]) -> None:
    """tests/data/study_group was written from the README's schema reference alone."""
    assert main(["rosters", "check", str(STUDY_GROUP)]) == 0
    captured = capsys.readouterr()
    assert "OK, roster 'study_group' with 3 personas, 2 user profiles, 3 scenarios" in captured.out
    assert captured.err == ""
