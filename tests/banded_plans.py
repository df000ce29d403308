"""A small modelled job and its Perseus plan with a saving band, for the band's tests."""

from __future__ import annotations

from megatron_energy.dvfs.spec import GpuSpec, load_gpu_spec
from megatron_energy.optimisers.interface import PlanningJob
from megatron_energy.pipeline.profile import Profile, TransformerShape
from megatron_energy.pipeline.schedule_orders import pipeline_orders
from megatron_energy.plan import fingerprint
from megatron_energy.target import parse_target

SPEC = load_gpu_spec("h100-sxm")
STAGES = 4


def small_profile(spec: GpuSpec = SPEC, source: str = "modelled") -> Profile:
    """GPT-3 1.3B stage work on 4 stages over every third clock from 900 MHz (modelled, unless ``source``)."""
    shape = TransformerShape.from_name("gpt3-1.3b", micro_batch_size=4)
    clocks = [clock for clock in spec.sm_clocks_mhz if clock >= 900][::3]
    profile = Profile.synthetic(shape, spec, STAGES, clocks_mhz=clocks)
    options = {key: profile.options(key) for key in profile}
    return Profile(options, profile.gpu_name, source, profile.blocked_power_w, profile.idle_power_w)


def small_job() -> PlanningJob:
    """The job of :func:`small_profile`: 8 microbatches, iso-time, the spec's switch latency."""
    return PlanningJob(
        pipeline_orders(STAGES, 8),
        fingerprint(job="band-test"),
        parse_target("iso-time"),
        switch_latency_s=SPEC.switch_latency_s,
        frontier_points=12,
        gpu=SPEC,
    )
