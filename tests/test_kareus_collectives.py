"""The collective naming scheme and the per-rank collectives built from a job (pipeline/collectives.py)."""

from __future__ import annotations

import pytest

from megatron_energy.job import JobConfig
from megatron_energy.pipeline.collectives import (
    AFTER_OPTIMIZER_PHASE,
    END_PHASE,
    CollectiveNameError,
    CollectiveWorkload,
    build_collectives,
    chunk_parameter_layers,
    collective_name,
    parse_collective_name,
    phase_layer,
    traffic_factor,
)
from tests.kareus_jobs import EXAMPLE_7B, workload_of


def test_names_round_trip() -> None:
    assert collective_name("dp", "reduce_scatter", bucket=0) == "dp.reduce_scatter.bucket0"
    parsed = parse_collective_name("dp.all_gather.chunk1.bucket3")
    assert (parsed.group, parsed.op, parsed.chunk, parsed.bucket) == ("dp", "all_gather", 1, 3)
    assert parse_collective_name("tp.all_reduce").class_key == "tp.all_reduce"


@pytest.mark.parametrize(
    "name",
    [
        "dp.reduce_scatter",
        "pp.send_recv.bucket0",
        "tp.all_reduce.chunk0",
        "xx.all_reduce",
        "dp.bcast.bucket0",
    ],
)
def test_bad_names_are_refused_with_the_scheme(name: str) -> None:
    with pytest.raises(CollectiveNameError, match=r"collective"):
        parse_collective_name(name)


def test_phases() -> None:
    assert phase_layer("layer3", 8) == 3
    assert phase_layer(END_PHASE, 8) == 8
    assert phase_layer(AFTER_OPTIMIZER_PHASE, 8) is None
    with pytest.raises(CollectiveNameError):
        phase_layer("layer8", 8)


def test_traffic_factors() -> None:
    assert traffic_factor("all_reduce", 4) == pytest.approx(1.5)
    assert traffic_factor("reduce_scatter", 4) == pytest.approx(0.75)
    assert traffic_factor("send_recv", 2) == 1.0


def test_buckets_cover_every_parameter_once_and_launch_no_earlier_than_ready() -> None:
    job = JobConfig.load(EXAMPLE_7B)
    workload: CollectiveWorkload = workload_of(job)
    collectives = build_collectives(workload)
    for stage in range(job.pipeline_stages):
        for chunk in range(job.virtual_stages):
            prefix = f"dp.reduce_scatter.chunk{chunk}.bucket"
            buckets = [c for c in collectives if c.stage == stage and c.name.startswith(prefix)]
            total = sum(chunk_parameter_layers(workload, stage, chunk))
            assert sum(c.bytes_per_launch for c in buckets) == pytest.approx(2 * total, rel=1e-6)
            for bucket in buckets:
                # every launch point is on the chunk's last backward and ends with "end"
                assert bucket.launch_points[-1].phase == END_PHASE
                assert {p.instruction.kind for p in bucket.launch_points} == {"backward"}
                first = phase_layer(bucket.launch_points[0].phase, workload.layers_per_chunk)
                assert first is not None
                # ready only once the backward has passed the bucket's lowest layer
                assert first >= workload.layers_per_chunk - max(bucket.layers[0], 0)
    inline = {c.name for c in collectives if c.stage == 1 and not c.cls.per_bucket}
    assert inline == {"pp.send_recv", "tp.all_gather", "tp.reduce_scatter"}
