"""One reader of JSONL files of pydantic records, with one error line (training.jsonl)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict

from mascot.training.data.candidates import read_candidates
from mascot.training.jsonl import JsonlError, read_records


class Row(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    size: int


def test_records_validated_with_their_line_numbers(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text('{"name": "a", "size": 1}\n\n{"name": "b", "size": 2}\n')
    assert [(n, r.name) for n, r in read_records(path, Row, "a row")] == [(1, "a"), (3, "b")]
    assert list(read_records(tmp_path / "missing.jsonl", Row, "a row")) == []


def test_a_bad_record_is_one_line_naming_file_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text('{"name": "a", "size": 1}\n{"name": "b", "size": "big"}\n')
    with pytest.raises(JsonlError) as caught:
        list(read_records(path, Row, "a row"))
    assert str(caught.value) == (f"{path}:2: not a row (field 'size': Input should be a valid integer, "
                                 "unable to parse string as an integer)")


def test_skipped_candidates_say_which_field(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "candidates.jsonl"
    path.write_text('{"context_id": "c"}\n')
    with caplog.at_level(logging.WARNING):
        assert read_candidates(path) == []
    assert f"{path}:1: not a candidate (field '" in caplog.text
