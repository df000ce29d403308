"""The stock clocks of a job: every instruction at the highest clock it was profiled at.

Every optimiser's baseline and the iteration ``iso-time`` keeps (``perseus.frontier``, ``kernel.stock``).
"""

from __future__ import annotations

from megatron_energy.pipeline.dag import PipelineDag
from megatron_energy.pipeline.instruction import Step
from megatron_energy.pipeline.profile import Profile


def all_max_clocks(dag: PipelineDag, profile: Profile) -> dict[Step, int]:
    """Every compute node of ``dag`` at the highest clock its instruction was profiled at (the baseline)."""
    top = {key: max(option.clock_mhz for option in profile.options(key)) for key in profile}
    return {node: top[node.work] for node in dag.compute_steps()}
