"""Plot a plan's time–energy frontier (matplotlib, Agg), every curve and marker labelled as modelled."""

from __future__ import annotations

from pathlib import Path

from megatron_energy.plan import Plan


def plot_frontier(plan: Plan, path: Path) -> Path:
    """Plot the plan's frontier curve, its lower bound, its executable points, stock and target to a PNG.

    The curve is the instant-switch frontier (clocks change the moment an instruction starts); the plan's
    points, the target among them, are the executable plans that pay the GPU's switch latency, so they sit
    on or above the curve. Both are drawn, so the gap between them is visible, not a surprise.

    Args:
        plan: The plan (all figures in it are modelled from its profile).
        path: The PNG to write.

    Returns:
        The path written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5), layout="constrained")
    samples = sorted(plan.frontier)
    axes.plot(
        [s.time_s for s in samples],
        [s.energy_j for s in samples],
        "o-",
        markersize=3,
        label="frontier, instant clock switches",
    )
    axes.plot(
        [s.deadline_s for s in samples],
        [s.lower_bound_j for s in samples],
        "--",
        color="grey",
        label="relaxed lower bound",
    )
    latency_ms = 1e3 * plan.switch_latency_s
    axes.plot(
        [p.iteration_time_s for p in plan.points],
        [p.energy_j for p in plan.points],
        "D",
        markersize=5,
        color="tab:green",
        label=f"executable plans ({latency_ms:g} ms switches)",
    )
    axes.plot(
        plan.baseline.iteration_time_s, plan.baseline.energy_j, "s", color="black", label="all-maximum clocks"
    )
    target = plan.target_point
    axes.plot(
        target.iteration_time_s,
        target.energy_j,
        "*",
        markersize=14,
        color="tab:red",
        label=f"plan for {plan.target}",
    )
    axes.set_xlabel("iteration time (s)")
    axes.set_ylabel("energy per iteration, all stages (J)")
    axes.set_title(f"time–energy frontier, modelled from a {plan.provenance} profile ({plan.gpu_name})")
    axes.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
