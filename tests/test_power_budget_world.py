"""Issue 33, item 5: a power budget out of reach before profiling, in a world of megatron-core ranks.

PP=2, 4 microbatches of GPT-3 1.3B stage work on simulated H100s (every figure modelled), a 4-clock grid.
``power:150`` is above the spec's idle power (115 W), so the flag parser lets it through, but below what the
job draws with every instruction at the spec's lowest clock (about 180 W, modelled): simulated GPUs are the
spec's model, so it is refused before profiling, once, on rank 0, and every rank trains at stock clocks. A
budget out of the profile's reach only (refused after profiling, its profile kept for a retry) is
``tests/test_session_end_to_end.py``'s.
"""

from __future__ import annotations

import re

import pytest
from session_world import RankReport, SessionSettings, run_world

from megatron_energy.target import parse_target

pytestmark = pytest.mark.world  # spawns gloo worlds of megatron-core ranks

GRID_MHZ = (1980, 1755, 1530, 1305)
FALLBACK_PHASE = "stock (planning failed)"
PER_RANK = re.compile(r"\[energy\] rank \d+: not optimising")
SAID_ONCE = "[energy] not optimising, training continues at stock clocks on every rank: --energy-target"


@pytest.fixture(scope="module")
def below_the_model(tmp_path_factory) -> list[RankReport]:
    settings = SessionSettings(
        pipeline_size=2,
        num_microbatches=4,
        gpu_spec="h100-sxm",
        target=parse_target("power:130"),  # below the 137.3 W the calibrated H100 draws at its lowest clock
        freq_grid=GRID_MHZ,
        profile_iters=1,
        run_steps=4,
        energy_dir=tmp_path_factory.mktemp("energy"),
    )
    return run_world(settings, tmp_path_factory.mktemp("results"))


def test_a_budget_below_the_models_floor_is_refused_before_profiling_once(below_the_model) -> None:
    for report in below_the_model:
        assert [step.phase for step in report.steps] == [FALLBACK_PHASE] * len(report.steps), "no profiling"
        assert not [line for line in report.lines if PER_RANK.match(line)], "not once per rank"
    (line,) = [line for line in below_the_model[0].lines if line.startswith(SAID_ONCE)]
    assert "no plan can meet it: the job draws at least " in line
    assert "W per GPU with every instruction at h100-sxm's lowest clock (modelled from the GPU spec" in line
    assert all(not [line for line in report.lines if SAID_ONCE in line] for report in below_the_model[1:])
