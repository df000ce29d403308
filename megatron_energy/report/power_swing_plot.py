"""Plot a few iterations' job power (matplotlib, Agg): stock against plan against a filler floor, modelled.

One panel per way the replicas line up (in phase; spread), each case's whole-job power in megawatts read in
the figures' bins (:data:`~megatron_energy.power_swing.DEFAULT_RESOLUTION_S`), as a step curve.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from megatron_energy.power_swing import DEFAULT_RESOLUTION_S
from megatron_energy.sim.swing_cases import ScaledCase

_COLOURS = {"stock": "black", "plan": "tab:green", "filler floor": "tab:red"}


def plot_power_swing(rows: Sequence[Sequence[ScaledCase]], path: Path, title: str) -> Path:
    """Draw each scale's cases (one panel per scale) to a PNG.

    Args:
        rows: One list of cases per scale, all of one job size (in phase, spread).
        path: The PNG to write.
        title: What the figures are (modelled, the GPU spec).

    Returns:
        The path written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, panels = plt.subplots(
        len(rows), 1, figsize=(8, 2.8 * len(rows) + 0.6), layout="constrained", squeeze=False, sharex=True
    )
    for axes, scale_rows in zip(panels[:, 0], rows, strict=True):
        scale = scale_rows[0].job.scale
        for row in scale_rows:
            bins = row.job.trace.binned(DEFAULT_RESOLUTION_S, keep_partial=True)
            megawatts = [*(bins.power_w / 1e6), bins.power_w[-1] / 1e6]
            axes.step(
                bins.edges_s, megawatts, where="post", color=_COLOURS.get(row.case.name), label=row.case.name
            )
        lined_up = "in phase" if scale.in_phase else f"offsets spread over {scale.spread:g} of an iteration"
        replicas = scale_rows[0].job.replicas
        axes.set_title(f"{scale.gpus:,} GPUs, {replicas:,} replicas {lined_up}", fontsize=9)
        axes.set_ylabel("job power (MW, modelled)")
        axes.legend(fontsize=7, loc="lower right")
    panels[-1, 0].set_xlabel(f"time (s), power read in {1e3 * DEFAULT_RESOLUTION_S:g} ms bins")
    figure.suptitle(title, fontsize=9)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
