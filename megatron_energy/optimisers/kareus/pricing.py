"""A Kareus point's prediction under the switch latency: the one figure its plan file carries (*modelled*).

The collective search prices choices with the overlap model (``sim.overlap``), which switches clocks
instantly. A plan's prediction must hold under the GPU's switch latency, as every other optimiser's does, so a
point is priced in two parts: its clocks (the base clocks shifted by the choices' clock offsets) by the
pipeline simulator under the switch latency (``sim.simulator``, as Perseus's executable points are), plus
what the collective choices change under the overlap model at those clocks (the choices against
megatron-core's defaults). With the defaults, a point's prediction is therefore exactly the simulator's on
its clocks: a Kareus point that schedules nothing predicts what its base point (or stock clocks) predicts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from megatron_energy.optimisers.kareus.choices import ChoiceKey, ClassChoice, KareusModel
from megatron_energy.pipeline.instruction import Instruction
from megatron_energy.sim.overlap_result import StageOverlapEnergy
from megatron_energy.sim.simulator import Simulator


@dataclass(frozen=True)
class PricedPoint:
    """A point's clocks and choices with their latency-aware prediction (modelled)."""

    clocks: dict[Instruction, int]
    """Every instruction's clock (base clocks shifted by the choices' offsets)."""

    iteration_time_s: float
    """Predicted iteration time under the switch latency."""

    stage_energy_j: tuple[float, ...]
    """Predicted energy of each stage's GPU per iteration."""

    stage_busy_s: tuple[float, ...]
    """Predicted busy time of each stage's GPU (computing, or computing beside a collective)."""

    @property
    def energy_j(self) -> float:
        """Predicted energy of the pipeline's GPUs per iteration."""
        return sum(self.stage_energy_j)


def price_point(
    model: KareusModel,
    simulator: Simulator,
    base_clocks: Mapping[Instruction, int] | None,
    choices: Mapping[ChoiceKey, ClassChoice],
) -> PricedPoint:
    """The latency-aware prediction of ``choices`` on ``base_clocks`` (module docstring).

    Args:
        model: The job's Kareus model (overlap simulator and collectives).
        simulator: The pipeline simulator of the same DAG and profile, with the GPU's switch latency.
        base_clocks: The base plan's clocks; stock (fastest) clocks when ``None``.
        choices: Every class's choice.
    """
    clocks = model.clocks(base_clocks, choices)
    run = simulator.run(clocks)
    chosen = model.evaluate(base_clocks, choices)
    reference = model.evaluate(clocks, model.choices_default())
    return PricedPoint(
        clocks=clocks,
        iteration_time_s=run.iteration_time_s + chosen.iteration_time_s - reference.iteration_time_s,
        stage_energy_j=tuple(
            stage.total_energy_j + mine.total_j - theirs.total_j
            for stage, mine, theirs in zip(run.stages, chosen.stages, reference.stages, strict=True)
        ),
        stage_busy_s=tuple(
            stage.busy_s + _busy_s(mine) - _busy_s(theirs)
            for stage, mine, theirs in zip(run.stages, chosen.stages, reference.stages, strict=True)
        ),
    )


def _busy_s(stage: StageOverlapEnergy) -> float:
    return stage.phase("compute").time_s + stage.phase("overlap").time_s
