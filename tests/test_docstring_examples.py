"""The ``Example:`` sections of public docstrings run as written, so they cannot drift."""

from __future__ import annotations

import doctest
import inspect
from collections.abc import Callable
from typing import Any

import pytest

from mascot.graphs.director import create_director_graph

#: The functions whose docstrings hold an ``Example:`` section.
DOCUMENTED: list[Callable[..., Any]] = [create_director_graph]


def example_section(function: Callable[..., Any]) -> str:
    """The ``Example:`` section of ``function``'s docstring, up to the next section or the end."""
    doc = inspect.getdoc(function) or ""
    lines = doc.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() in ("Example:", "Examples:"))
    section = []
    for line in lines[start + 1:]:
        if line and not line[0].isspace():  # the next section (e.g. "Note:")
            break
        section.append(line)
    return "\n".join(section)


@pytest.mark.parametrize("function", DOCUMENTED, ids=lambda f: f"{f.__module__}.{f.__qualname__}")
def test_docstring_example_runs(function: Callable[..., Any]) -> None:
    text = example_section(function)
    test = doctest.DocTestParser().get_doctest(text, {}, function.__qualname__, function.__module__, 0)
    assert test.examples, f"{function.__qualname__}: its Example: section holds no >>> example"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{function.__qualname__}: its Example: section fails (see the output above)"
