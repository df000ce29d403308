"""Plot a time–energy frontier (matplotlib, Agg): plans, relaxed lower bound, stock and chosen point."""

from __future__ import annotations

from pathlib import Path

from megatron_energy.perseus.frontier import Frontier, FrontierPoint
from megatron_energy.pipeline.profile import Profile


def plot_frontier(frontier: Frontier, chosen: FrontierPoint, profile: Profile, path: Path) -> Path:
    """Plot the frontier, its lower bound, the all-maximum-clocks point and the chosen plan to a PNG.

    Args:
        frontier: The solved frontier (all figures modelled from ``profile``).
        chosen: The plan picked for the target.
        profile: The profile the frontier was solved on (its source and GPU label the title).
        path: The PNG to write.

    Returns:
        The path written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5), layout="constrained")
    points = frontier.points
    axes.plot(
        [p.time_s for p in points],
        [p.energy_j for p in points],
        "o-",
        markersize=3,
        label="plans (simulated)",
    )
    axes.plot(
        [p.deadline_s for p in points],
        [p.lower_bound_j for p in points],
        "--",
        color="grey",
        label="relaxed lower bound",
    )
    baseline = frontier.baseline
    axes.plot(
        baseline.iteration_time_s, baseline.total_energy_j, "s", color="black", label="all-maximum clocks"
    )
    axes.plot(chosen.time_s, chosen.energy_j, "*", markersize=14, color="tab:red", label="chosen plan")
    axes.set_xlabel("iteration time (s)")
    axes.set_ylabel("energy per iteration, all stages (J)")
    axes.set_title(f"time–energy frontier: modelled from a {profile.source} profile ({profile.gpu_name})")
    axes.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
