"""``measured.json``: what a re-plan needs besides the profile and the baseline, read back unchanged."""

from __future__ import annotations

import pytest

from megatron_energy.dvfs.model import WorkProfile
from megatron_energy.optimisers.interface import ProfileRequest
from megatron_energy.pipeline.collectives import MeasuredBucket
from megatron_energy.pipeline.dag_nodes import IterationTail
from megatron_energy.pipeline.instruction import Work
from megatron_energy.runtime.profiling.measured_inputs import MeasuredInputs


def test_every_measured_input_round_trips_through_json() -> None:
    measured = MeasuredInputs(
        request=ProfileRequest(clock_grid=True, phases=True, collectives=True),
        tail=IterationTail.measured(0.004, [1.5, 2.5]),
        tail_phases=(("grad-sync", 0.002), ("optimizer", 0.001)),
        phase_timelines={
            Work(0, 0, "forward"): [("gemm", WorkProfile(0.01, 0.002)), ("norm", WorkProfile(0, 1e-3))]
        },
        buckets=(MeasuredBucket(stage=0, chunk=0, index=0, layers=(-1, 2), elements=1000),),
    )
    assert MeasuredInputs.from_json(measured.to_json()) == measured
    assert MeasuredInputs.from_json(MeasuredInputs(ProfileRequest()).to_json()) == MeasuredInputs(
        ProfileRequest()
    )


def test_a_record_that_is_not_one_is_refused() -> None:
    with pytest.raises(ValueError, match=r"measured\.json does not hold measured planning inputs"):
        MeasuredInputs.from_json('{"request": {}}')


def test_a_profile_made_for_a_request_lacks_what_another_asks_for_beyond_it() -> None:
    perseus, kernel = ProfileRequest(clock_grid=True), ProfileRequest(clock_grid=True, phases=True)
    assert perseus.lacking(kernel) == ["phases"]
    assert kernel.lacking(perseus) == [] and kernel.lacking(kernel) == []
