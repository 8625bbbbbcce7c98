"""Every option says what it does, and the training commands list their recipe's own settings
(read from the recipe classes' docstrings) in their help and in docs/cli.md."""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path

import pytest

from mascot.cli import main
from mascot.cli.main import _parser
from mascot.cli.recipe_flags import _attributes, recipe_settings
from mascot.cli.reference import cli_reference


def _reference_rows() -> dict[str, list[tuple[str, str]]]:
    """command -> (option, what it does) of each row of the generated reference."""
    rows: dict[str, list[tuple[str, str]]] = {}
    command = ""
    for line in cli_reference().splitlines():
        if line.startswith("### `"):
            command = line.removeprefix("### `").removesuffix("`")
        elif line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            rows.setdefault(command, []).append((cells[0].strip("`"), cells[1]))
    return rows


def test_every_option_of_every_command_has_help_in_the_reference() -> None:
    rows = _reference_rows()
    assert len(rows) > 20
    silent = [f"{command}: {option}" for command, options in rows.items() for option, text in options if not text]
    assert silent == []


def test_the_directors_recipe_settings_are_listed_with_their_docs() -> None:
    from mascot.training.fitting.director_training import DirectorTrainingConfig

    listed = dict(_reference_rows()["mascot train-director"])
    ours = [f.name for f in fields(DirectorTrainingConfig) if f.name != "training"]
    assert "block_turns" in ours and sum(name.endswith("_weight") for name in ours) == 6
    for name in ours:
        option = next((o for o in listed if o.split()[0] == f"--{name}"), None)
        assert option is not None, name
        assert listed[option], name
        assert ("(default" in listed[option]) == (name != "init_adapter"), name  # the one without a default
    assert "Turns played after each sampled direction" in listed["--block_turns N"]


def test_a_setting_documented_once_on_the_base_is_inherited() -> None:
    lora = {s.name: s.doc for s in recipe_settings("mascot.training.fitting.warm_start", "WarmStartConfig")}
    assert lora["lora_r"] == "LoRA rank."
    assert lora["init_adapter"].startswith("A saved LoRA adapter folder")
    with pytest.raises(LookupError, match="no class Nope"):
        recipe_settings("mascot.training.fitting.warm_start", "Nope")


def test_attributes_read_continuation_lines_and_stop_at_the_next_section() -> None:
    doc = "Title.\n\nAttributes:\n    a: One\n        two.\n    b: Three.\n\nRaises:\n    c: not an attribute\n"
    assert _attributes(doc) == {"a": "One two.", "b": "Three."}


def test_recipe_settings_reach_the_recipe_parser_in_order(tmp_path: Path) -> None:
    args, extra = _parser().parse_known_args(
        ["train-speakers", "--roster", "emotional_support", "--out", str(tmp_path), "--lora_target_modules",
         "q_proj", "v_proj", "--lora_r", "8", "--per_persona", "false", "--learning_rate", "1e-5"])
    assert args.trainer_flags == ["--lora_target_modules", "q_proj", "v_proj", "--lora_r", "8",
                                  "--per_persona", "false"]
    assert extra == ["--learning_rate", "1e-5"]
    assert not isinstance(getattr(args, "lora_r", None), str)  # kept for the recipe, not a namespace field


def test_a_bad_recipe_setting_is_refused_by_the_recipe(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train-director", "--roster", "emotional_support", "--episodes", "e.jsonl", "--speakers",
                 "s.yaml", "--out", str(tmp_path), "--block_turns", "0"]) == 2
    assert "block_turns=0" in capsys.readouterr().err


def test_the_commands_own_flag_wins_over_a_recipe_setting_of_the_same_name() -> None:
    speakers = next(a for a in _parser()._subparsers._group_actions[0].choices["train-speakers"]._actions
                    if "--personas" in a.option_strings)
    assert speakers.metavar == "A,B" and not isinstance(speakers, argparse._StoreTrueAction)
