"""Every reward reads a TRL completion's text the same way (mascot.training.rewards.completion_text)."""

from __future__ import annotations

import ast
from pathlib import Path

from mascot.training.rewards import completion_text

TRAINING = Path(__file__).resolve().parents[1] / "mascot" / "training"


def test_plain_and_conversational_completions() -> None:
    assert completion_text("just text") == "just text"
    assert completion_text([{"role": "assistant", "content": "a"}]) == "a"
    assert completion_text([{"role": "assistant", "content": "a"}, {"role": "tool", "content": "x"},
                            {"role": "assistant", "content": "b"}]) == "a\nb"
    assert completion_text([]) == ""


def test_no_trainer_reads_completions_its_own_way() -> None:
    joins = []
    for path in [*(TRAINING / "fitting").glob("*.py"), TRAINING / "rewards.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join":
                if "['content']" in ast.unparse(node):
                    joins.append(path.name)
    assert joins == ["rewards.py"]  # completion_text's own
