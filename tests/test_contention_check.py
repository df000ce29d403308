"""The CPU maths of scripts/gpu_contention.py (sim/contention_check.py) on synthetic measurements."""

from __future__ import annotations

import pytest

from megatron_energy.dvfs.spec import load_gpu_spec
from megatron_energy.sim.contention import CommLoad
from megatron_energy.sim.contention_check import (
    CheckSetup,
    CopyLaw,
    Window,
    compare,
    fit_copy_law,
    fit_sm_bandwidth,
    predict,
)

SPEC = load_gpu_spec("h200")
SETUP = CheckSetup(gemms=8, launch_after=2, copy_bytes=8 * 2**30)
GEMM = Window("gemm", None, time_s=8 * 1.4e-3, power_w=690.0)
LAW = CopyLaw(link_gbps=4000.0, per_cta_gbps=60.0)


def copy_window(ctas: int) -> Window:
    return Window("copy", ctas, SETUP.copy_bytes / (min(4000.0, 60.0 * ctas) * 1e9), 300.0 + 2.0 * ctas)


def test_the_copy_law_is_recovered_from_copy_alone_windows() -> None:
    law = fit_copy_law(SETUP.copy_bytes, [copy_window(c) for c in (8, 16, 32, 66, 132)])
    assert law.link_gbps == pytest.approx(4000.0)
    assert law.per_cta_gbps == pytest.approx(60.0)


def test_overlap_prediction_lies_between_serial_and_perfect_overlap() -> None:
    for ctas in (8, 32, 132):
        alone = copy_window(ctas)
        time_s, energy_j = predict(SPEC, SETUP, GEMM, LAW, alone.power_w, ctas)
        assert max(GEMM.time_s, alone.time_s) <= time_s <= GEMM.time_s + alone.time_s + 1e-12
        assert energy_j < GEMM.energy_j + alone.energy_j
    # more CTAs: a shorter copy, but GEMMs slowed more while it runs
    fast = predict(SPEC, SETUP, GEMM, LAW, copy_window(132).power_w, 132)[0]
    slow = predict(SPEC, SETUP, GEMM, LAW, copy_window(8).power_w, 8)[0]
    assert fast < slow


def test_compare_reports_zero_error_on_windows_the_model_made_and_flags_a_wrong_one() -> None:
    setup = CheckSetup(gemms=8, launch_after=2, copy_bytes=8 * 2**30, ctas_per_sm=8)
    per_sm_gbps = 150.0
    windows = [GEMM] + [copy_window(c) for c in (8, 32, 66)]
    for ctas in (8, 32, 66):
        time_s, energy_j = predict(SPEC, setup, GEMM, LAW, copy_window(ctas).power_w, ctas, per_sm_gbps)
        windows += [Window("overlap", ctas, time_s, energy_j / time_s)] * 3
    _, fitted_gbps, rows = compare(SPEC, setup, windows)
    assert fitted_gbps == pytest.approx(per_sm_gbps)  # from overlap:8, the fewest CTAs
    by_key = {row.key: row for row in rows}
    assert [key for key, row in by_key.items() if row.calibration] == ["overlap:8"]
    assert by_key["overlap:32"].time_error == pytest.approx(0.0, abs=1e-9)
    assert by_key["overlap:66"].energy_error == pytest.approx(0.0, abs=1e-9)
    assert by_key["overlap:32"].rounds == 3
    slower = [*windows, Window("overlap", 32, 1.2 * by_key["overlap:32"].measured_time_s, 500.0)]
    _, _, rows = compare(SPEC, setup, slower)
    assert {r.key: r for r in rows}["overlap:32"].time_error < -0.01
    with pytest.raises(ValueError, match="copy-alone"):
        compare(SPEC, SETUP, [GEMM, Window("overlap", 16, 0.01, 600.0)])


def test_a_packed_copy_holds_fewer_sms_and_is_capped_per_sm() -> None:
    spread = CommLoad(8, link_bandwidth_gbps=4000.0, cta_bandwidth_gbps=80.0)
    packed = CommLoad(8, 4000.0, 80.0, ctas_per_sm=8, sm_bandwidth_gbps=150.0, packed=True)
    assert (spread.held_sms, spread.bandwidth_gbps) == (8, 640.0)
    assert (packed.held_sms, packed.bandwidth_gbps) == (1, 150.0)
    nine = CommLoad(66, 4000.0, 80.0, ctas_per_sm=8, sm_bandwidth_gbps=150.0, packed=True)
    assert (nine.held_sms, nine.bandwidth_gbps) == (9, 1350.0)


def test_the_per_sm_bandwidth_needs_a_copy_that_outlasts_the_gemms() -> None:
    setup = CheckSetup(gemms=8, launch_after=2, copy_bytes=8 * 2**30, ctas_per_sm=8)
    launch_s = setup.launch_s(GEMM)
    long_copy = Window("overlap", 16, launch_s + 0.05, 400.0)
    assert fit_sm_bandwidth(setup, GEMM, long_copy) == pytest.approx(8 * 2**30 / 0.05 / 1e9 / 2)
    with pytest.raises(ValueError, match="fewer CTAs"):
        fit_sm_bandwidth(setup, GEMM, Window("overlap", 132, GEMM.time_s, 690.0))
