"""The suite's tiers (``tiers``): the full tier runs every test, ``--fast`` exactly the unmarked ones."""

from __future__ import annotations

import re

import pytest

MARKED = """
import time

import pytest


def test_plain():
    pass


@pytest.mark.world
def test_in_a_world():
    pass


@pytest.mark.slow
def test_slow():
    pass


@pytest.mark.parametrize("n", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_one_slow_case(n):
    pass


def test_unmarked_but_slow():
    time.sleep(0.2)
"""


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    """A suite of marked and unmarked tests, with this repository's marks registered and strict."""
    pytester.makeini("[pytest]\naddopts = --strict-markers\nmarkers =\n    world: w\n    slow: s\n")
    pytester.makepyfile(test_marked=MARKED)
    return pytester


def test_the_full_tier_runs_every_test(suite: pytest.Pytester) -> None:
    suite.runpytest("-p", "tiers").assert_outcomes(passed=6)


def test_the_fast_tier_leaves_out_exactly_the_marked_tests_and_cases(suite: pytest.Pytester) -> None:
    result = suite.runpytest("-p", "tiers", "--fast", "-v")
    result.assert_outcomes(passed=3, deselected=3)
    assert set(re.findall(r"::(\S+) PASSED", result.stdout.str())) == {
        "test_plain",
        "test_one_slow_case[1]",
        "test_unmarked_but_slow",
    }


def test_an_unmarked_test_over_the_budget_fails_the_fast_tier_asking_for_the_mark(
    suite: pytest.Pytester,
) -> None:
    over = ("-p", "tiers", "-o", "fast_test_budget_s=0.1")
    result = suite.runpytest(*over, "--fast")
    result.assert_outcomes(passed=2, failed=1, deselected=3)
    result.stdout.fnmatch_lines(
        ["*call took 0.* s, over the fast tier's 0.1 s: mark the test (or its file) slow"]
    )
    suite.runpytest(*over).assert_outcomes(passed=6)  # the full tier holds no test to the budget
