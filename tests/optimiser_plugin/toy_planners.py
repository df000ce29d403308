"""Toy optimisers that plan slowly or whose planner process dies, installed like ``toy_fixed_clocks``.

They exercise the planner process (``runtime.planning_round.planner_process``) and the session's planning
phase (``tests/test_background_planning.py``): each runs in the planner process, never in a rank.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from toy_fixed_clocks import FixedClockPerKind

from megatron_energy.optimisers.interface import PlanningJob
from megatron_energy.pipeline.profile import Profile
from megatron_energy.plan import Plan

PLAN_SLEEP_S = 3.0
"""How long :class:`SlowFixedClocks` plans."""


class SlowFixedClocks(FixedClockPerKind):
    """The fixed clocks per kind, after :data:`PLAN_SLEEP_S` of planning."""

    name = "toy-slow"

    def plan(self, profile: Profile, job: PlanningJob, base: Plan | None = None) -> Plan:
        time.sleep(PLAN_SLEEP_S)
        return super().plan(profile, job, base)


class HangingPlanner(FixedClockPerKind):
    """Plans for ten minutes: long enough to be stopped."""

    name = "toy-hangs"

    def plan(self, profile: Profile, job: PlanningJob, base: Plan | None = None) -> Plan:
        time.sleep(600)
        return super().plan(profile, job, base)


class ExitingPlanner(FixedClockPerKind):
    """Ends its process with status 3 while planning, as a crash in a native solver would."""

    name = "toy-exits"

    def plan(self, profile: Profile, job: PlanningJob, base: Plan | None = None) -> Plan:
        print("toy planner: giving up", flush=True)
        os._exit(3)


class KilledPlanner(FixedClockPerKind):
    """Its process is killed by SIGKILL while planning (the kernel's OOM killer would)."""

    name = "toy-killed"

    def plan(self, profile: Profile, job: PlanningJob, base: Plan | None = None) -> Plan:
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable")


class RaisingPlanner(FixedClockPerKind):
    """Raises while planning, as a solver bug would."""

    name = "toy-raises"

    def plan(self, profile: Profile, job: PlanningJob, base: Plan | None = None) -> Plan:
        raise RuntimeError("toy solver failure")


class CorruptingPlanner(FixedClockPerKind):
    """Leaves a result file that is no pickle, then exits with status 0."""

    name = "toy-corrupts"

    def plan(self, profile: Profile, job: PlanningJob, base: Plan | None = None) -> Plan:
        (Path(sys.argv[1]) / "result.pkl").write_bytes(b"not a pickle")
        os._exit(0)
