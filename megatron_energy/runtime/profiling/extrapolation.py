"""Profile rows for clocks that could not be measured, extrapolated from the stock clock with the model.

Without clock control (``--energy-dry-run``, or monitor-only when the GPU refuses clock changes) every step
runs at the stock clock, so a sweep would only measure noise. The session then measures the stock clock and
this module extends each instruction's stock measurement to the rest of the grid with the time/power model
(``dvfs.model.fit_work_profile`` from one point: the spec's prior split of compute- and memory-bound work,
its compute time of the instruction's kernel classes from the workload model where the job's shape is known).

The model is anchored to the measurement: at the measured clock a row keeps the measured time and energy
(up to rounding), and at every clock the modelled time and energy are scaled by the same factors that turn the
model's figures at the measured clock into the measured ones (the model gives the *change* with the clock,
the measurement the level). The stock plan's prediction therefore reproduces the measured stock figures.
The resulting profile, and every plan made from it, is *modelled*.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from megatron_energy.dvfs.kernel_classes import ClassMix
from megatron_energy.dvfs.model import GpuPowerModel, fit_work_profile
from megatron_energy.dvfs.spec import GpuSpec
from megatron_energy.pipeline.instruction import Work
from megatron_energy.runtime.profiling.collector import ProfileRow


def extrapolate_rows(
    rows: Sequence[ProfileRow],
    spec: GpuSpec,
    clocks_mhz: Sequence[int],
    compute_mixes: Mapping[Work, ClassMix] | None = None,
) -> list[ProfileRow]:
    """Extend one rank's stock-clock rows to every clock of the grid.

    Args:
        rows: Rows measured at one clock (the stock clock).
        spec: The GPU's spec (the model's parameters).
        clocks_mhz: The clocks to produce rows for.
        compute_mixes: The kernel classes of each instruction class's compute time (the workload model's,
            ``JobContext.compute_mixes``); ``None`` or a class missing: bf16 GEMMs.

    Returns:
        One row per instruction class and clock; times and energies modelled, anchored to the measured row.
    """
    model = GpuPowerModel(spec)
    extended = []
    for row in rows:
        mix = (compute_mixes or {}).get(row.work)
        work = fit_work_profile(spec, [(row.clock_mhz, row.time_s, row.energy_j)], mix).work
        time_scale = row.time_s / model.time_s(work, row.clock_mhz)
        energy_scale = row.energy_j / model.energy_j(work, row.clock_mhz)
        extended += [
            ProfileRow(
                work=row.work,
                clock_mhz=clock,
                time_s=time_scale * model.time_s(work, clock),
                energy_j=energy_scale * model.energy_j(work, clock),
                samples=row.samples,
            )
            for clock in clocks_mhz
        ]
    return extended
