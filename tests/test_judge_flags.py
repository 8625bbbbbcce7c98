"""The judge flags mean the same in every command that judges (`judge`, `eval`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mascot.cli import main


@pytest.mark.parametrize(("flags", "message"), [
    (["--judge-model", "x", "--model", "y"], "use either the judge flags"),
    (["--judge-base-url", "http://127.0.0.1:9/v1"], "--judge-base-url needs --judge-model"),
    (["--judge-policies", "p.yaml", "--judge-base-url", "http://127.0.0.1:9/v1"], "go with --judge-model"),
    (["--judge-model", "x", "--judge-api-key-env", "KEY"], "--judge-api-key-env only applies with --judge-base-url"),
])
def test_bad_judge_flags_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str],
                                      message: str) -> None:
    episodes = tmp_path / "episodes.jsonl"
    episodes.write_text("")
    argv = ["judge", "--in", str(episodes), "--rubric", "persona", "--roster", "emotional_support", *flags,
            "--out", str(tmp_path / "judged.jsonl")]
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mascot: error: ") and message in lines[0]


def test_judge_and_eval_define_the_judge_flags_once() -> None:
    for command in ("judge", "eval"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
    import mascot.cli.evaluation as evaluation
    import mascot.cli.judging as judging

    for module in (evaluation, judging):
        source = Path(module.__file__).read_text()
        assert '"--judge-model"' not in source and "add_judge_flags(" in source
