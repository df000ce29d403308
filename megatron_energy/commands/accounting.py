"""What ``megatron-energy plan`` tells about its energy accounting and its profile, besides the plan itself.

The accounting (blocked and idle power, clock-switch latency) changes both the plan and the figures printed
for it, and may come from flags or silently from a GPU spec, so the command names each value and its origin.
Profile rows that are faster at a lower clock are accepted (the planner only looks at time and energy) but
reported, since they make the all-maximum-clocks baseline slower than some other plan.
"""

from __future__ import annotations

from dataclasses import dataclass

from megatron_energy.pipeline.profile import Profile

SHOWN_ROW_WARNINGS = 5
"""Profile row warnings printed in full; the rest are counted."""


@dataclass(frozen=True)
class Accounting:
    """The energy accounting a plan was made under, and where each figure came from.

    Attributes:
        blocked_power_w: Power while blocked on pipeline communication.
        idle_power_w: Power while idle after a stage's last instruction.
        powers_from: Where the two powers came from, e.g. ``"from --gpu-spec h200"``.
        switch_latency_s: Clock-switch latency the plan was made executable under.
        latency_from: Where the latency came from, e.g. ``"no GPU spec given"``.
    """

    blocked_power_w: float
    idle_power_w: float
    powers_from: str
    switch_latency_s: float
    latency_from: str

    def describe(self) -> str:
        """One paragraph: the powers and the latency, their origins, and what the latency does to the plan."""
        powers = (
            f"energy accounting: blocked {self.blocked_power_w:g} W, idle {self.idle_power_w:g} W "
            f"({self.powers_from})"
        )
        if self.switch_latency_s <= 0:
            return f"{powers}; clock switches are instant ({self.latency_from})"
        return (
            f"{powers}; clock switches take {1e3 * self.switch_latency_s:g} ms ({self.latency_from}): "
            "the frontier assumes instant switches, then the plan is made executable under this latency, "
            "which costs time or energy the lower bound does not include (--switch-latency-ms 0 plans for "
            "instant switches)"
        )


def row_warning_lines(profile: Profile) -> list[str]:
    """Warning lines for the profile's rows that are faster at a lower clock (none when there are none)."""
    warnings = profile.row_warnings()
    if not warnings:
        return []
    lines = [
        f"warning: {len(warnings)} profile row(s) faster at a lower clock than at a higher one (measurement "
        "noise?); the all-maximum-clocks baseline is then not the fastest plan, and savings are against it:"
    ]
    lines += [f"  {warning}" for warning in warnings[:SHOWN_ROW_WARNINGS]]
    if len(warnings) > SHOWN_ROW_WARNINGS:
        lines.append(f"  ... and {len(warnings) - SHOWN_ROW_WARNINGS} more")
    return lines


def format_gap(gap: float) -> str:
    """A plan's gap to its lower bound in percent, signed; rounding noise near zero shows as ``+0.000 %``."""
    percent = 100 * gap
    if abs(percent) < 0.0005:
        percent = 0.0
    return f"{percent:+.3f} %"
