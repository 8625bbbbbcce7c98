"""The Example sections of the reward functions' docstrings run as written (doctest), so they cannot rot."""

from __future__ import annotations

import doctest
from types import ModuleType

import pytest

from mascot.training import rewards
from mascot.training.fitting import director_rewards

#: Every public reward function (and the Director's terms) shows a runnable example.
DOCUMENTED = {
    rewards: {"completion_text", "format_reward", "roster_format_reward", "weighted_rewards", "model_reward",
              "redundancy_penalty_reward", "distinct_reward", "round_redundancy_reward"},
    director_rewards: {"DirectorRewards", "neutral_where_unscored", "standardise_by_group"},
}
EXAMPLES = [(module, test) for module in DOCUMENTED for test in doctest.DocTestFinder().find(module) if test.examples]


def test_every_public_reward_has_an_example() -> None:
    for module, names in DOCUMENTED.items():
        found = {test.name.rsplit(".", 1)[-1] for owner, test in EXAMPLES if owner is module}
        assert names <= found, f"{module.__name__}: no Example in {sorted(names - found)}"


@pytest.mark.parametrize(("module", "example"), EXAMPLES, ids=[test.name for _, test in EXAMPLES])
def test_the_example_runs(module: ModuleType, example: doctest.DocTest) -> None:
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    output: list[str] = []
    result = runner.run(example, out=output.append)
    assert result.failed == 0, "".join(output)
