"""`mascot show`: episodes in the terminal and as one HTML page. (`mascot eval` runs end to
end in the demo test, tests/test_demo.py.)"""

from __future__ import annotations

import json
import sys
from pathlib import Path

MASCOT = str(Path(sys.executable).parent / "mascot")


def test_show_prints_and_writes_one_page(episodes: list, tmp_path: Path, capsys) -> None:
    from mascot.cli import main
    from mascot.training.jsonl import JsonlAppender

    source = tmp_path / "episodes.jsonl"
    with JsonlAppender(source) as sink:
        for episode in episodes:
            sink.write(episode.record())
    first = episodes[0]
    turn = next(i for i, m in enumerate(first.messages) if m.role == "assistant")
    judged = tmp_path / "judged.jsonl"
    judged.write_text(json.dumps({"episode_id": first.id, "turn": turn, "status": "ok", "overall": 87.5}) + "\n")
    assert main(["show", str(source), "--limit", "1"]) == 0
    printed = capsys.readouterr().out
    assert "Person:" in printed and "»" in printed
    page = tmp_path / "page.html"
    assert main(["show", str(source), "--html", str(page), "--judgements", str(judged)]) == 0
    text = page.read_text()
    assert text.startswith("<!doctype html>") and "judge 88" in text and "http" not in text.split("<body>")[0]
    assert first.messages[0].content.replace("'", "&#x27;")[:20] in text
    assert main(["show", str(tmp_path / "missing.jsonl")]) == 2
