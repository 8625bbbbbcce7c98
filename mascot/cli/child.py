"""The one place where mascot re-enters its own command line in a child process.

``mascot pipeline`` runs each stage as the ``mascot`` command a user would type
(``pipeline_run``), and ``mascot rollout --workers N`` starts N ``mascot rollout`` shards
(``rollout_workers``). Both build the child's command line here, and nothing else in the
package does (``tests/test_import_boundary.py`` checks it): the child is this interpreter
running ``python -m mascot``, so it is the installed package of the parent, whatever
``mascot`` script may be on the ``PATH``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def mascot_command(argv: Sequence[str]) -> list[str]:
    """The command line that runs ``mascot ARGV`` in a child process.

    Args:
        argv: The ``mascot`` arguments (a subcommand and its flags).

    Returns:
        ``[python, "-m", "mascot", *argv]`` with this process's interpreter.
    """
    return [sys.executable, "-m", "mascot", *argv]
