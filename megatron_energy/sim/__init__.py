"""Discrete-event simulation of a pipeline iteration: iteration time, energy per GPU and the timeline.

All figures produced here are modelled (from a profile and the pipeline DAG), never measured.
"""

from megatron_energy.sim.simulator import SimResult, SimulatedStage, Simulator, Slice, StagePowers

__all__ = ["SimResult", "SimulatedStage", "Simulator", "Slice", "StagePowers"]
