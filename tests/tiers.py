"""The suite's two tiers, a pytest plugin (``conftest`` loads it): the full suite, and ``--fast``.

The full tier (``bash scripts/test.sh``, CI) runs every test. The fast tier (``bash scripts/test.sh --fast``)
leaves out the tests marked ``world`` (gloo worlds of megatron-core ranks) or ``slow`` (other processes, or
over about a second), and holds the rest to a budget a phase (ini value ``fast_test_budget_s``): a test that
runs past it fails, asking for the mark. So a slow test cannot hide in the fast tier, and every test is in the
full one.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Generator

import pytest

FULL_TIER_MARKS = ("world", "slow")
"""The marks of the tests that only the full tier runs."""

FAST_TEST_BUDGET_S = 5.0
"""The most a fast-tier test may spend in its setup, its call or its teardown, unless the ini file says
otherwise (a loaded 2-core machine's seconds: the tests the fast tier keeps take well under one)."""

PRELOADED = ("megatron.core",)
"""Imported before the fast tier's first test: megatron-core's import costs seconds of CPU once per process
(most of the fast tier needs it), which is no test's own time."""


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register ``--fast`` and the ini value ``fast_test_budget_s``."""
    parser.addoption(
        "--fast",
        action="store_true",
        help=f"the fast tier: leave out the tests marked {' or '.join(FULL_TIER_MARKS)}",
    )
    parser.addini(
        "fast_test_budget_s",
        "the most seconds a test of the fast tier may spend in a phase",
        type="float",
        default=FAST_TEST_BUDGET_S,
    )


def in_fast_tier(item: pytest.Item) -> bool:
    """Whether ``item`` carries none of ``FULL_TIER_MARKS``."""
    return not any(item.get_closest_marker(mark) for mark in FULL_TIER_MARKS)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``--fast``, deselect the tests of the full tier only (pytest counts them as deselected)."""
    if not config.getoption("fast"):
        return
    left_out = [item for item in items if not in_fast_tier(item)]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if in_fast_tier(item)]


def pytest_collection_finish(session: pytest.Session) -> None:
    """Under ``--fast``, import ``PRELOADED`` once the tests are known (none is charged for it)."""
    if session.config.getoption("fast") and session.items:
        with warnings.catch_warnings(action="ignore"):
            for name in PRELOADED:
                importlib.import_module(name)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Under ``--fast``, fail a phase that passed but ran past ``fast_test_budget_s``, naming the mark."""
    report = yield
    budget_s = item.config.getini("fast_test_budget_s")
    if item.config.getoption("fast") and report.passed and report.duration > budget_s:
        report.outcome = "failed"
        report.longrepr = (
            f"{report.when} took {report.duration:.1f} s, over the fast tier's {budget_s:g} s: "
            "mark the test (or its file) slow"
        )
    return report
