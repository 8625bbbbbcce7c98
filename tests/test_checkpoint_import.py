from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import subprocess
import sys
import uuid
from contextlib import closing
from pathlib import Path
from typing import TypedDict

import pytest
from fakes import ScriptedChat
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import START, MessagesState, StateGraph

from mascot.graphs import create_director_graph
from mascot.rosters import USER, load_scenarios
from mascot.training.episodes.checkpoint_import import CheckpointImportError, episode_id, import_checkpoints
from mascot.training.episodes.episode import read_episodes

# thread id -> rounds; a round is the person's message and (persona, action, reply) turns
CONVERSATIONS = {
    "alice": [
        ("I failed my driving test again", [("anchor", "validate", "That sounds so discouraging."),
                                            ("catalyst", "probe", "What went differently this time?")]),
        ("The parking, again", [("action_guide", "plan", "Book one lesson on parking only.")]),
    ],
    "bob": [("My team ignores my ideas", [("beacon", "encourage", "Your ideas deserve a hearing.")])],
    "carol": [("I can't sleep", [("anchor", "soothe", "Nights like that are hard."),
                                 ("action_guide", "suggest", "Try no screens after ten.")])],
}


def d(speaker: str, action: str) -> str:
    return json.dumps({"speaker": speaker, "action": action, "tone": "warm"})


def run_director(roster, checkpointer, thread_id: str, rounds, **first_input) -> str:
    """Run the real director graph, one run per round; return the latest checkpoint id."""
    director = ScriptedChat(replies=[r for _, turns in rounds
                                     for r in [*(d(p, a) for p, a, _ in turns), d(USER, "over")]])
    speakers = ScriptedChat(replies=[reply for _, turns in rounds for _, _, reply in turns])
    graph = create_director_graph(roster, director=director, speakers=speakers, user=None).compile(
        checkpointer=checkpointer)
    config = {"configurable": {"thread_id": thread_id}}
    for number, (text, _) in enumerate(rounds):
        graph.invoke({"messages": [HumanMessage(text)], **(first_input if number == 0 else {})}, config)
    assert not director.replies and not speakers.replies
    return graph.get_state(config).config["configurable"]["checkpoint_id"]


def expected_chat(rounds) -> list[dict[str, str]]:
    chat = []
    for text, turns in rounds:
        chat.append({"role": "user", "content": text})
        chat += [{"role": "assistant", "content": reply, "name": persona} for persona, _, reply in turns]
    return chat


def _without_offer(direction: dict | None) -> dict | None:
    return None if direction is None else {k: v for k, v in direction.items() if k != "offered"}


def expected_directions(rounds) -> list[dict[str, str]]:
    return [x for _, turns in rounds
            for x in [*({"speaker": p, "action": a, "tone": "warm"} for p, a, _ in turns),
                      {"speaker": USER, "action": "over", "tone": "warm"}]]


@pytest.fixture
def director_db(roster, tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A SqliteSaver database of three director-graph threads; returns it and the checkpoint ids."""
    path = tmp_path / "app.db"
    connection = sqlite3.connect(path, check_same_thread=False)
    extra = {"alice": {"scenario": load_scenarios(roster.id)[0].model_dump(),
                       "user_profile": roster.user_profiles[0].model_dump()}}
    ids = {tid: run_director(roster, SqliteSaver(connection), tid, rounds, **extra.get(tid, {}))
           for tid, rounds in CONVERSATIONS.items()}
    connection.close()
    return path, ids


def by_thread(out: Path) -> dict[str, object]:
    return {e.source.thread_id: e for e in read_episodes(out)}


def test_director_threads_become_episodes(roster, director_db, tmp_path: Path) -> None:
    db, checkpoint_ids = director_db
    before = db.read_bytes()
    out = tmp_path / "episodes.jsonl"
    report = import_checkpoints(f"sqlite:///{os.path.relpath(db)}", roster=roster.id, out=out)
    assert (report.threads, report.imported, report.already, report.unreadable) == (3, 3, 0, [])
    assert report.out == out
    episodes = by_thread(out)
    assert sorted(episodes) == ["alice", "bob", "carol"]
    for tid, rounds in CONVERSATIONS.items():
        episode = episodes[tid]
        assert episode.id == "thread-" + hashlib.sha256(tid.encode()).hexdigest()[:16]
        assert episode.roster == "emotional_support"
        assert episode.chat() == expected_chat(rounds)
        assert [_without_offer(m.stage_direction) for m in episode.messages if m.role == "assistant"] == [
            {"speaker": p, "action": a, "tone": "warm"} for _, turns in rounds for p, a, _ in turns]
        assert [_without_offer(d) for d in episode.directions] == expected_directions(rounds)
        # what each decision was offered comes through the checkpoint too, the chosen voice among it
        assert all(d["speaker"] in d["offered"] for d in episode.directions if "offered" in d)
        assert any("offered" in d for d in episode.directions)
        assert (episode.source.kind, episode.source.checkpoint_id) == ("checkpoint", checkpoint_ids[tid])
    alice = episodes["alice"]
    assert alice.scenario.id == load_scenarios(roster.id)[0].id
    assert alice.user_profile.id == roster.user_profiles[0].id
    assert episodes["bob"].scenario is None
    assert db.read_bytes() == before  # opened read-only


def test_reimport_is_idempotent(roster, director_db, tmp_path: Path) -> None:
    db, _ = director_db
    out = tmp_path / "episodes.jsonl"
    first = import_checkpoints(f"sqlite:///{db}", roster=roster.id, out=out)  # absolute: four slashes
    assert str(db).startswith("/") and first.imported == 3
    content = out.read_bytes()
    again = import_checkpoints(f"sqlite:///{db}", roster=roster.id, out=out)
    assert (again.threads, again.imported, again.already, again.unreadable) == (3, 0, 3, [])
    assert out.read_bytes() == content
    assert [e.id for e in read_episodes(out)] == [episode_id(t) for t in ("alice", "bob", "carol")]


def test_thread_filter_and_unknown_thread(roster, director_db, tmp_path: Path, caplog) -> None:
    db, _ = director_db
    out = tmp_path / "episodes.jsonl"
    with caplog.at_level(logging.WARNING):
        report = import_checkpoints(f"sqlite:///{db}", roster=roster.id, out=out, thread_ids=["bob", "nobody"])
    assert (report.threads, report.imported, report.already) == (2, 1, 0)
    assert report.unreadable == [("nobody", "no such thread")]
    assert list(by_thread(out)) == ["bob"]
    assert "'nobody' not imported: no such thread" in caplog.text


def test_a_copy_not_in_wal_mode_is_read_unchanged(roster, director_db, tmp_path: Path) -> None:
    db, _ = director_db
    copy = tmp_path / "snapshot.db"
    with closing(sqlite3.connect(db)) as connection, connection:  # commit, then close
        connection.execute("VACUUM INTO ?", (str(copy),))  # a snapshot in rollback-journal mode
    before = copy.read_bytes()
    report = import_checkpoints(f"sqlite:///{copy}", roster=roster.id, out=tmp_path / "episodes.jsonl")
    assert (report.imported, report.unreadable) == (3, [])
    assert copy.read_bytes() == before  # still in its own journal mode: not switched to WAL


class Counter(TypedDict):
    count: int


def _generic_app(db: Path) -> None:
    """A MessagesState app (named AI replies, tool traffic) and two threads that are no conversation."""

    def reply(state: MessagesState) -> dict:
        if state["messages"][-1].type != "human":
            return {"messages": []}
        question = state["messages"][-1].text
        return {"messages": [
            AIMessage("", name="helper", tool_calls=[{"name": "lookup", "args": {"q": question}, "id": "c1"}]),
            ToolMessage("42", tool_call_id="c1"),
            AIMessage(f"The answer to '{question}' is 42.", name="helper"),
        ]}

    connection = sqlite3.connect(db, check_same_thread=False)
    app = StateGraph(MessagesState)
    app.add_node("reply", reply)
    app.add_edge(START, "reply")
    graph = app.compile(checkpointer=SqliteSaver(connection))
    graph.invoke({"messages": [HumanMessage("life?")]}, {"configurable": {"thread_id": "app-1"}})
    graph.invoke({"messages": [SystemMessage("You are helpful.")]}, {"configurable": {"thread_id": "app-empty"}})
    counter = StateGraph(Counter)
    counter.add_node("inc", lambda state: {"count": state["count"] + 1})
    counter.add_edge(START, "inc")
    counter.compile(checkpointer=SqliteSaver(connection)).invoke({"count": 1},
                                                                 {"configurable": {"thread_id": "counter"}})
    connection.close()


def test_generic_messages_app(tmp_path: Path) -> None:
    db = tmp_path / "generic.db"
    _generic_app(db)
    out = tmp_path / "episodes.jsonl"
    report = import_checkpoints(f"sqlite:///{db}", roster="my_app", out=out, thread_ids=["app-1"])
    assert (report.imported, report.unreadable) == (1, [])
    [episode] = read_episodes(out)
    assert episode.roster == "my_app"
    assert episode.chat() == [{"role": "user", "content": "life?"},
                              {"role": "assistant", "content": "The answer to 'life?' is 42.", "name": "helper"}]
    assert episode.directions == [] and episode.messages[1].stage_direction is None


def test_unreadable_threads_are_reported_and_the_rest_imported(roster, director_db, tmp_path: Path, caplog) -> None:
    db, _ = director_db
    _generic_app(db)
    with closing(sqlite3.connect(db)) as connection, connection:  # commit, then close
        connection.execute("UPDATE checkpoints SET checkpoint = ? WHERE thread_id = 'bob'", (b"\xc1\xc1garbage",))
    out = tmp_path / "episodes.jsonl"
    with caplog.at_level(logging.WARNING):
        report = import_checkpoints(f"sqlite:///{db}", roster=roster.id, out=out)
    assert (report.threads, report.imported, report.already) == (6, 3, 0)
    reasons = dict(report.unreadable)
    assert sorted(reasons) == ["app-empty", "bob", "counter"]
    assert reasons["bob"].startswith("checkpoint cannot be deserialised (")
    assert reasons["counter"] == "the state has no 'messages' list"
    assert reasons["app-empty"].startswith("no conversation")
    assert sorted(by_thread(out)) == ["alice", "app-1", "carol"]
    assert all(f"'{tid}' not imported" in caplog.text for tid in reasons)
    assert "Traceback" not in caplog.text


def bad_database(tmp: Path, kind: str) -> str:
    """The URI of a database that cannot be imported."""
    if kind == "text file":
        (tmp / "notes.db").write_text("not a database, just text " * 20)
        return f"sqlite:///{tmp}/notes.db"
    if kind == "other database":
        with closing(sqlite3.connect(tmp / "other.db")) as connection:
            connection.execute("CREATE TABLE t (x)")
        return f"sqlite:///{tmp}/other.db"
    return {"missing file": f"sqlite:///{tmp}/missing.db", "directory": f"sqlite:///{tmp}",
            "two slashes": "sqlite://relative.db", "other scheme": "mysql://bob:hunter2@db/app",
            "no scheme": str(tmp / "app.db")}[kind]


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("missing file", "no SQLite database at"),
        ("directory", "(a directory)"),
        ("text file", "is not a SQLite database"),
        ("other database", "has no LangGraph checkpoint tables"),
        ("two slashes", "bad SQLite URI 'sqlite://relative.db'"),
        ("other scheme", "unsupported database URI 'mysql://bob:***@db/app'"),
        ("no scheme", "schemes: sqlite, postgresql, postgres"),
    ],
)
def test_user_errors_are_one_line(tmp_path: Path, kind: str, message: str) -> None:
    with pytest.raises(CheckpointImportError) as info:
        import_checkpoints(bad_database(tmp_path, kind), roster="r", out=tmp_path / "out.jsonl")
    assert message in str(info.value) and "\n" not in str(info.value)
    assert "hunter2" not in str(info.value)
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize(
    ("uri", "shown", "reason"),
    [
        ("postgresql://bob:hunter2@127.0.0.1:1/app?password=hunter3", "postgresql://bob:***@127.0.0.1:1/app?password=***",
         "Connection refused"),
        ("postgresql://bob:hunter2%zz@127.0.0.1:1/app", "postgresql://bob:***@127.0.0.1:1/app",
         'invalid percent-encoded token: "***"'),  # libpq quotes the bad token: the password
    ],
)
def test_unreachable_postgres_never_shows_the_password(tmp_path: Path, caplog, uri: str, shown: str,
                                                      reason: str) -> None:
    pytest.importorskip("langgraph.checkpoint.postgres")
    with caplog.at_level(logging.DEBUG), pytest.raises(CheckpointImportError) as info:
        import_checkpoints(uri, roster="r", out=tmp_path / "out.jsonl")
    text = str(info.value)
    assert text.startswith(f"cannot read {shown}: ") and reason in text
    assert "\n" not in text and "hunter" not in text + caplog.text


def test_redact_applies_to_written_lines(roster, director_db, tmp_path: Path) -> None:
    db, _ = director_db
    out = tmp_path / "episodes.jsonl"
    import_checkpoints(f"sqlite:///{db}", roster=roster.id, out=out, redact=lambda line: line.replace("parking", "[x]"))
    assert "parking" not in out.read_text() and by_thread(out)["alice"].messages[3].content == "The [x], again"


def test_postgres_without_the_extra(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "langgraph.checkpoint.postgres", None)  # import fails
    with pytest.raises(CheckpointImportError, match=r'pip install "mascot\[postgres\]"'):
        import_checkpoints("postgres://h/db", roster="r", out=tmp_path / "out.jsonl")


def test_postgres_checkpointer(roster, tmp_path: Path) -> None:
    url = os.environ.get("MASCOT_TEST_POSTGRES_URL")
    if not url:
        pytest.skip("set MASCOT_TEST_POSTGRES_URL (.ci/run starts a server)")
    from langgraph.checkpoint.postgres import PostgresSaver

    prefix = f"test-{uuid.uuid4().hex[:8]}-"
    with PostgresSaver.from_conn_string(url) as saver:
        saver.setup()
        ids = {prefix + tid: run_director(roster, saver, prefix + tid, CONVERSATIONS[tid]) for tid in ("alice", "bob")}
    out = tmp_path / "episodes.jsonl"
    report = import_checkpoints(url, roster=roster.id, out=out, thread_ids=sorted(ids))
    assert (report.threads, report.imported, report.unreadable) == (2, 2, [])
    episodes = by_thread(out)
    for tid in ("alice", "bob"):
        episode = episodes[prefix + tid]
        assert episode.chat() == expected_chat(CONVERSATIONS[tid])
        assert [_without_offer(d) for d in episode.directions] == expected_directions(CONVERSATIONS[tid])
        assert episode.source.checkpoint_id == ids[prefix + tid]
    everything = import_checkpoints(url.replace("postgresql://", "postgres://", 1), roster=roster.id, out=out)
    assert everything.threads >= 2 and everything.already >= 2  # every thread listed; ours already there
    no_tables = f"{url}{'&' if '?' in url else '?'}options=-csearch_path%3Dno_such_schema"
    with pytest.raises(CheckpointImportError, match="has no LangGraph checkpoints table"):
        import_checkpoints(no_tables, roster=roster.id, out=out)


def test_import_logs_command(director_db, tmp_path: Path) -> None:
    db, _ = director_db
    mascot = str(Path(sys.executable).parent / "mascot")
    out = tmp_path / "app.jsonl"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([mascot, "import-logs", "--roster", "emotional_support", "--out", str(out), *args],
                              capture_output=True, text=True, timeout=120)

    first = run("--from", f"sqlite:///{db.resolve()}")
    assert first.returncode == 0, first.stderr
    assert "3 new episodes from 3 threads, 0 already in" in first.stdout
    again = run("--from", f"sqlite:///{db.resolve()}", "--thread-id", "bob", "--thread-id", "nobody")
    assert again.returncode == 1  # a named thread could not be imported
    assert "0 new episodes from 2 threads, 1 already in" in again.stdout
    assert "thread 'nobody' not imported" in again.stderr
    assert len(out.read_text().splitlines()) == 3
    text = tmp_path / "notes.db"
    text.write_text("not a database")
    bad = run("--from", f"sqlite:///{text}")
    assert bad.returncode == 2 and bad.stderr.startswith("mascot: error: ") and "Traceback" not in bad.stderr
