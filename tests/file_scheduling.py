"""How pytest-xdist shares the test files among its workers (``conftest.pytest_xdist_make_scheduler``).

A whole test file goes to one worker, so a module-scoped world runs once; the files that read the session's
one demo run (``demo_run``) go to the same worker, so it runs once too. Files are handed out in collection
order (``conftest`` puts the ones that spawn worlds first) when pytest runs with ``--no-loadscope-reorder``.

(pytest-xdist's own ``--dist loadgroup`` would express the grouping with marks, but it renames node ids in a
way pytest 9 ignores, so its groups never form.)
"""

from __future__ import annotations

from pathlib import PurePosixPath

from xdist.scheduler import LoadScopeScheduling

SHARED_RUN_FILES = {"test_demo_command.py": "demo", "test_command_input.py": "demo"}
"""Test files that use one session fixture's run, by the name of the unit they are scheduled in."""


class FileScheduling(LoadScopeScheduling):
    """``--dist loadfile``, with the files of ``SHARED_RUN_FILES`` scheduled as one unit."""

    def _split_scope(self, nodeid: str) -> str:
        path = nodeid.split("::", 1)[0]
        return SHARED_RUN_FILES.get(PurePosixPath(path).name, path)
