"""The collective naming scheme and the per-rank collectives built from a job (pipeline/collectives.py)."""

from __future__ import annotations

import pytest

from megatron_energy.job import JobConfig
from megatron_energy.pipeline.collective_names import (
    AFTER_OPTIMIZER,
    END,
    GEMM_OVERLAP,
    CollectiveName,
    CollectiveNameError,
    LaunchPoint,
    layer_start,
)
from megatron_energy.pipeline.collectives import (
    CollectiveWorkload,
    build_collectives,
    chunk_parameter_layers,
    traffic_factor,
)
from tests.kareus_jobs import EXAMPLE_7B, workload_of


def test_names_are_typed_and_print_in_the_contracts_dotted_form() -> None:
    assert str(CollectiveName("dp", "reduce_scatter", bucket=0)) == "dp.reduce_scatter.bucket0"
    name = CollectiveName("dp", "all_gather", 1, 3)
    assert str(name) == "dp.all_gather.chunk1.bucket3" and name.class_key == "dp.all_gather"
    assert CollectiveName("tp", "all_reduce").class_key == "tp.all_reduce"


@pytest.mark.parametrize(
    "parts",
    [("dp", "reduce_scatter", None, None), ("pp", "send_recv", None, 0), ("tp", "all_reduce", 0, None)],
)
def test_bad_names_are_refused_with_the_scheme(parts) -> None:
    with pytest.raises(CollectiveNameError, match=r"collective"):
        CollectiveName(*parts)


def test_launch_points() -> None:
    assert layer_start(3).layers_done(8) == 3
    assert str(layer_start(3)) == "layer3" and str(END) == "end"
    assert END.layers_done(8) == 8
    assert AFTER_OPTIMIZER.layers_done(8) is None and GEMM_OVERLAP.layers_done(8) is None
    with pytest.raises(CollectiveNameError):
        layer_start(8).layers_done(8)
    with pytest.raises(CollectiveNameError, match="names a layer exactly when"):
        LaunchPoint("end", 2)
    with pytest.raises(CollectiveNameError, match="names a layer exactly when"):
        LaunchPoint("layer")


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
            buckets = [
                c
                for c in collectives
                if c.stage == stage and c.name.class_key == "dp.reduce_scatter" and c.name.chunk == chunk
            ]
            total = sum(chunk_parameter_layers(workload, stage, chunk))
            assert sum(c.bytes_per_launch for c in buckets) == pytest.approx(2 * total, rel=1e-6)
            for bucket in buckets:
                # every launch point is on the chunk's last backward and ends with "end"
                assert bucket.launch_points[-1].phase == END
                assert {p.instruction.kind for p in bucket.launch_points} == {"backward"}
                point = bucket.launch_points[0].phase
                assert isinstance(point, LaunchPoint)
                first = point.layers_done(workload.layers_per_chunk)
                assert first is not None
                # ready only once the backward has passed the bucket's lowest layer
                assert first >= workload.layers_per_chunk - max(bucket.layers[0], 0)
    inline = {str(c.name) for c in collectives if c.stage == 1 and not c.cls.per_bucket}
    assert inline == {"pp.send_recv", "tp.all_gather", "tp.reduce_scatter"}
