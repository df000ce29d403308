"""Plot a plan's time–energy frontiers (matplotlib, Agg), every curve and marker labelled as modelled.

Two frontiers are drawn side by side:

* the **instant-switch** frontier: the solver's curve, every point a plan whose clocks change the moment an
  instruction starts (``Plan.frontier``, one sample per deadline of the sweep);
* the **latency-aware** frontier: the plans that pay the GPU's clock-switch latency (a requested clock takes
  effect only later, ``perseus.switch_latency``), i.e. what would run. Making a point latency-aware simulates
  and repairs it, so the plan file holds it only at its executable points (``Plan.points``: the target and a
  spread of others, a subset of the instant-switch samples); the curve joins those points, and its legend
  says how many of the frontier's points it covers.

The chosen plan's star is its executable point, so it sits on the latency-aware curve; the instant-switch
curve lies on or below it (switches cost time and energy), which the legend states rather than leaving the
gap unexplained.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from megatron_energy.plan import Plan


@dataclass(frozen=True)
class Series:
    """One curve or marker set of the plot (modelled figures).

    Attributes:
        key: What it is: ``instant``, ``bound``, ``latency``, ``stock`` or ``chosen``.
        label: Its legend entry.
        times_s: Iteration times.
        energies_j: Energies per iteration, all stages.
        style: matplotlib format string.
    """

    key: str
    label: str
    times_s: tuple[float, ...]
    energies_j: tuple[float, ...]
    style: str


def frontier_series(plan: Plan) -> list[Series]:
    """What :func:`plot_frontier` draws, in drawing order (see the module docstring).

    Args:
        plan: The plan (all figures in it are modelled from its profile).

    Returns:
        The instant-switch frontier, its relaxed lower bound, the latency-aware frontier through the plan's
        executable points, the all-maximum-clocks baseline and the chosen plan.
    """
    samples = sorted(plan.frontier)
    executable = sorted(plan.points, key=lambda point: (point.iteration_time_s, point.energy_j))
    latency_ms = 1e3 * plan.switch_latency_s
    switches = f"{latency_ms:g} ms clock switches" if latency_ms > 0 else "instant switches (no latency)"
    target = plan.target_point
    return [
        Series(
            "instant",
            f"frontier, instant clock switches ({len(samples)} points)",
            tuple(s.time_s for s in samples),
            tuple(s.energy_j for s in samples),
            "o-",
        ),
        Series(
            "bound",
            "relaxed lower bound",
            tuple(s.deadline_s for s in samples),
            tuple(s.lower_bound_j for s in samples),
            "--",
        ),
        Series(
            "latency",
            f"frontier with {switches}: the plan's {len(executable)} executable points "
            f"(of the {len(samples)} above)",
            tuple(p.iteration_time_s for p in executable),
            tuple(p.energy_j for p in executable),
            "D-",
        ),
        Series(
            "stock",
            "all-maximum clocks",
            (plan.baseline.iteration_time_s,),
            (plan.baseline.energy_j,),
            "s",
        ),
        Series(
            "chosen",
            f"chosen plan for {plan.target} (on the latency-aware frontier)",
            (target.iteration_time_s,),
            (target.energy_j,),
            "*",
        ),
    ]


_COLOURS = {
    "instant": "tab:blue",
    "bound": "grey",
    "latency": "tab:green",
    "stock": "black",
    "chosen": "tab:red",
}
_SIZES = {"instant": 3, "latency": 5, "chosen": 14}


def plot_frontier(plan: Plan, path: Path) -> Path:
    """Plot :func:`frontier_series` of ``plan`` to a PNG.

    Args:
        plan: The plan (all figures in it are modelled from its profile).
        path: The PNG to write.

    Returns:
        The path written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.8), layout="constrained")
    for series in frontier_series(plan):
        axes.plot(
            series.times_s,
            series.energies_j,
            series.style,
            markersize=_SIZES.get(series.key, 6),
            color=_COLOURS[series.key],
            label=series.label,
        )
    axes.set_xlabel("iteration time (s)")
    axes.set_ylabel("energy per iteration, all stages (J)")
    axes.set_title(
        f"time–energy frontiers, modelled from a {plan.provenance} profile ({plan.gpu_name})", fontsize=10
    )
    axes.legend(fontsize=7)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
