"""Each kernel class's response to the SM clock, measured from kernel timelines at several clocks.

Where clocks may be changed, the profiling steps record a kernel timeline at every clock of the grid
(``runtime.profiling.kernel_timeline``). At the reference (stock) clock every instruction range's kernels are
classified (``pipeline.phase_timeline.classify_kernel``); the same range at another clock launches the same
kernels in the same order, so they pair one to one by position (a range whose kernel names differ
between the two is left out). Per class, the paired kernels' summed duration at a clock over that at the
reference clock is the class's *measured* response.

:func:`fit_class_split` turns a response into the split of the class's time between compute-bound,
memory-bound and fixed work whose time under the GPU power model
(:meth:`~megatron_energy.dvfs.model.GpuPowerModel.time_s`) follows the measured response best (least
squares over the measured clocks; the compute-bound part priced with the class mix of the timeline's compute
kernels, whose power caps the clock). The
phases of a measured timeline then carry that split instead of the class's assumed one (all compute-bound,
all memory-bound, all fixed), so the phase planner prices them at every clock by measurement; their power at
a clock stays the model's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from megatron_energy.dvfs.kernel_classes import ClassMix
from megatron_energy.dvfs.model import GpuPowerModel, WorkProfile
from megatron_energy.dvfs.spec import GpuSpec
from megatron_energy.pipeline.phase_timeline import KernelRecord, PhaseClass, classify_kernel

ClassResponse = dict[PhaseClass, dict[int, float]]
"""Per kernel class, per clock (MHz): its time there over its time at the reference clock (measured)."""

KernelsByRange = Mapping[str, Sequence[KernelRecord]]
"""One step's kernels per annotated range (``pipeline.kineto_trace.kernels_by_annotation``)."""

SUM_WEIGHT = 1e3
"""Weight of the row that holds the shares' sum to one in the fit."""


def class_response(
    reference: Sequence[KernelsByRange],
    others: Mapping[int, Sequence[KernelsByRange]],
    reference_mhz: int,
    spec: GpuSpec,
) -> ClassResponse:
    """Each class's measured time at every clock relative to the reference clock (module docstring).

    Args:
        reference: Kernels per annotated range, one mapping per step recorded at the reference clock.
        others: The same per other clock.
        reference_mhz: The reference clock (its ratio is 1).
        spec: The GPU whose roofline classifies the reference kernels.

    Returns:
        Per class seen in paired ranges, its ratio at the reference clock and at every other clock.
    """
    base = _first_instances(reference)
    response: ClassResponse = {}
    for clock_mhz, steps in others.items():
        totals: dict[PhaseClass, list[float]] = {}
        for name, kernels in _first_instances(steps).items():
            stock = base.get(name)
            if stock is None or [k.name for k in stock] != [k.name for k in kernels]:
                continue
            for at_stock, at_clock in zip(stock, kernels, strict=True):
                pair = totals.setdefault(classify_kernel(at_stock, spec), [0.0, 0.0])
                pair[0] += at_stock.duration_s
                pair[1] += at_clock.duration_s
        for kind, (stock_s, clock_s) in totals.items():
            if stock_s > 0:
                response.setdefault(kind, {reference_mhz: 1.0})[clock_mhz] = clock_s / stock_s
    return response


def _first_instances(steps: Sequence[KernelsByRange]) -> dict[str, Sequence[KernelRecord]]:
    """Each range's kernels in launch order, from the first step that recorded it."""
    found: dict[str, Sequence[KernelRecord]] = {}
    for step in steps:
        for name, kernels in step.items():
            found.setdefault(name, sorted(kernels, key=lambda kernel: kernel.start_s))
    return found


def fit_class_split(
    response: Mapping[int, float],
    reference_mhz: int,
    model: GpuPowerModel,
    compute_mix: ClassMix | None = None,
) -> WorkProfile:
    """The compute/memory/fixed split whose modelled time follows ``response`` best.

    Non-negative least squares on the clocks' ratios as a linear mix of the three pure classes' ratios
    (their sum held to one) gives the start; bounded least squares on the model's own time ratio of the
    mixed work then refines it (a mix is not linear under the power cap: it caps the clock by its power).

    Args:
        response: Clock (MHz) -> time there over time at ``reference_mhz``.
        reference_mhz: The clock the ratios are relative to.
        model: The GPU power model whose time law the split is fitted under.
        compute_mix: The kernel classes of the compute-bound part (``None``: bf16 GEMMs).

    Returns:
        The work that takes one second at ``reference_mhz``, split as fitted.
    """
    from scipy.optimize import least_squares, nnls  # on first use, as in dvfs.model

    units = (
        WorkProfile(1.0, 0.0, compute_mix=compute_mix),
        WorkProfile(0.0, 1.0),
        WorkProfile(0.0, 0.0, 1.0),
    )
    clocks = sorted(response)
    target = np.array([response[f] for f in clocks])
    design = np.array(
        [[model.time_s(unit, f) / model.time_s(unit, reference_mhz) for unit in units] for f in clocks]
    )
    start, _ = nnls(np.vstack([design, SUM_WEIGHT * np.ones(3)]), np.append(target, SUM_WEIGHT))

    def ratios(x: np.ndarray) -> np.ndarray:
        work = WorkProfile.from_parts(x, compute_mix)
        return np.array([model.time_s(work, f) for f in clocks]) / model.time_s(work, reference_mhz)

    def residuals(x: np.ndarray) -> np.ndarray:
        return np.append(ratios(x) - target, SUM_WEIGHT * (x.sum() - 1.0))

    fitted = least_squares(residuals, np.clip(start, 1e-6, None), bounds=(0.0, np.inf)).x
    work = WorkProfile.from_parts(fitted, compute_mix)
    return work.scaled(1.0 / model.time_s(work, reference_mhz))
