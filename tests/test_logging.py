"""The package's logging: a logger per module under ``megatron_energy``, rank filtering, Megatron's format."""

from __future__ import annotations

import ast
import io
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from megatron_energy.log import ROOT_LOGGER, ConsoleHandler, configure_logging, log_single_rank

PACKAGE = Path(__file__).resolve().parents[1] / "megatron_energy"


class _Writes(io.StringIO):
    """A stream that keeps each ``write`` call apart."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def write(self, text: str) -> int:
        self.calls.append(text)
        return super().write(text)


@pytest.fixture
def console() -> Iterator[_Writes]:
    """``megatron_energy``'s logging configured as the launcher does, into a stream of its own."""
    stream = _Writes()
    root = logging.getLogger(ROOT_LOGGER)
    level = root.level
    configure_logging(stream=stream)
    yield stream
    configure_logging(stream=stream)  # every_rank off again
    for handler in [h for h in root.handlers if isinstance(h, ConsoleHandler)]:
        root.removeHandler(handler)
    root.setLevel(level)


def test_every_module_logs_through_its_own_logger_and_none_takes_a_printer() -> None:
    named: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            assert not (isinstance(node, ast.arg) and node.arg == "printer"), f"{path}: a printer parameter"
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "logging.getLogger":
                (arg,) = [ast.unparse(arg) for arg in node.args]
                if arg == "__name__":
                    named.add(".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts))
                else:  # the root (``log``), or another package's logger (megatron-core's, the demo quiets)
                    assert path.name == "log.py" or not arg.strip("'\"").startswith("megatron_energy"), path
    packages = {name.split(".")[1] for name in named}
    assert {"runtime", "dvfs", "megatron"} <= packages
    assert "megatron_energy.runtime.session" in named and "megatron_energy.runtime.assembly" in named


def test_info_lines_are_printed_as_they_are_in_one_write_and_other_levels_in_megatrons_format(
    console: _Writes,
) -> None:
    logging.getLogger("megatron_energy.runtime.session").info("[energy] iteration 10 | planned")
    logging.getLogger("megatron_energy.dvfs.guard").warning("could not reset the clocks")
    logging.getLogger("megatron_energy.dvfs.guard").debug("not shown at the default level")
    assert console.calls == [
        "[energy] iteration 10 | planned\n",
        "WARNING:megatron_energy.dvfs.guard:could not reset the clocks\n",
    ]


def test_the_log_level_flag_sets_the_package_level(console: _Writes) -> None:
    configure_logging("warning", stream=console)
    logging.getLogger("megatron_energy.runtime.session").info("[energy] hidden")
    assert console.calls == []
    configure_logging("debug", stream=console)
    logging.getLogger("megatron_energy.runtime.session").debug("detail")
    assert console.calls == ["DEBUG:megatron_energy.runtime.session:detail\n"]
    assert len([h for h in logging.getLogger(ROOT_LOGGER).handlers if isinstance(h, ConsoleHandler)]) == 1


def test_what_all_ranks_say_alike_is_said_by_rank_0_unless_every_rank_is_asked_for(
    console: _Writes,
) -> None:
    logger = logging.getLogger("megatron_energy.runtime.running.run_guard")
    for rank in (0, 1, 2):
        log_single_rank(logger, rank, f"[energy] the same on every rank (from {rank})")
    assert console.calls == ["[energy] the same on every rank (from 0)\n"]
    configure_logging(ranks="all", stream=console)
    log_single_rank(logger, 2, "[energy] the same on every rank (from 2)")
    assert console.calls[-1] == "[energy] the same on every rank (from 2)\n"


def test_records_propagate_to_the_root_logger(console: _Writes, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        logging.getLogger("megatron_energy.optimisers.registry").info("routed as Megatron's records are")
    assert caplog.records[-1].name == "megatron_energy.optimisers.registry"
    assert console.calls == ["routed as Megatron's records are\n"]


@pytest.mark.slow  # imports megatron-training (seconds)
def test_megatrons_console_handler_leaves_the_packages_records_to_their_own(console: _Writes) -> None:
    from megatron.training.log_handler import CustomHandler

    from megatron_energy.megatron.console_log import leave_energy_records_to_their_handler

    leave_energy_records_to_their_handler()
    megatron_console = CustomHandler()
    ours = logging.LogRecord("megatron_energy.runtime.session", logging.INFO, "", 0, "[energy] x", (), None)
    theirs = logging.LogRecord("megatron.core.utils", logging.INFO, "", 0, "built", (), None)
    assert not megatron_console.filter(ours) and megatron_console.filter(theirs)
