import itertools

import numpy as np
import pytest

from megatron_energy.dvfs.spec import load_gpu_spec
from megatron_energy.pipeline.instruction import Work
from megatron_energy.pipeline.profile import ClockOption, Profile, TransformerShape
from megatron_energy.pipeline.workload import KNOWN_SHAPES

HEADER = "stage,instruction,frequency,time,energy\n"


@pytest.fixture(scope="module")
def h200():
    return load_gpu_spec("h200")


@pytest.fixture(scope="module")
def gpt_profile(h200):
    shape = TransformerShape.from_name("gpt3-1.3b", micro_batch_size=4)
    return Profile.synthetic(shape, h200, num_stages=4)


def _one_stage(forward, backward, **kwargs):
    defaults = {"gpu_name": "h200", "source": "measured", "blocked_power_w": 155.0, "idle_power_w": 130.0}
    return Profile({Work(0, 0, "forward"): forward, Work(0, 0, "backward"): backward}, **(defaults | kwargs))


OPTIONS = [
    ClockOption(1980, 1.00, 10.0),
    ClockOption(1800, 1.00, 10.0),  # the same as 1980 (e.g. both above the power-cap clock)
    ClockOption(1500, 1.10, 8.0),
    ClockOption(1200, 1.20, 9.0),  # dominated by 1500
    ClockOption(1000, 1.40, 7.0),
]


def test_options_are_sorted_by_time_and_pareto_drops_dominated_and_duplicate_options():
    profile = _one_stage(OPTIONS, OPTIONS)
    key = Work(0, 0, "forward")
    assert [o.time_s for o in profile.options(key)] == sorted(o.time_s for o in OPTIONS)
    assert [o.clock_mhz for o in profile.pareto(key)] == [1800, 1500, 1000]
    assert profile.fastest(key) == ClockOption(1800, 1.00, 10.0)
    assert profile.option_at(key, 1200).energy_j == 9.0
    with pytest.raises(KeyError, match="no option at 1234 MHz"):
        profile.option_at(key, 1234)
    with pytest.raises(KeyError, match="no instruction"):
        profile.options(Work(5, 0, "forward"))


def test_pareto_of_a_synthetic_profile_dominates_every_other_option(gpt_profile):
    for key in gpt_profile:
        frontier = gpt_profile.pareto(key)
        assert all(a.time_s < b.time_s and a.energy_j > b.energy_j for a, b in itertools.pairwise(frontier))
        for option in gpt_profile.options(key):
            assert any(p.time_s <= option.time_s and p.energy_j <= option.energy_j for p in frontier)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {Work(0, 0, "forward"): OPTIONS},
            r"lacks instruction\(s\) \[Work\(stage=0, chunk=0, kind='backward'\)\]",
        ),
        ({Work(0, 0, "forward"): [], Work(0, 0, "backward"): OPTIONS}, "has no clock options"),
        ({Work(0, 0, "forward"): OPTIONS + OPTIONS[:1], Work(0, 0, "backward"): OPTIONS}, "more than once"),
        ({Work(0, 0, "sideways"): OPTIONS}, "kind must be one of"),
        # the old (stage, kind, chunk) tuple keys are refused, not silently misread
        ({(0, "forward", 0): OPTIONS, (0, "backward", 0): OPTIONS}, r"must be a Work\(stage, chunk, kind\)"),
    ],
)
def test_profile_rejects_malformed_options(options, message):
    with pytest.raises(ValueError, match=message):
        Profile(options, "h200", "measured", 155.0, 130.0)


def test_profile_rejects_unknown_source_and_bad_options():
    with pytest.raises(ValueError, match=r"one of \('measured', 'modelled', 'simulated'\)"):
        _one_stage(OPTIONS, OPTIONS, source="guessed")
    with pytest.raises(ValueError, match="time_s"):
        ClockOption(1980, 0.0, 1.0)
    with pytest.raises(ValueError, match="clock_mhz must be an integer"):
        ClockOption(1980.5, 1.0, 1.0)
    assert ClockOption(np.int64(1980), 1.0, 1.0).clock_mhz == 1980


@pytest.mark.parametrize("num_chunks", [1, 2])
def test_csv_round_trip_is_exact(tmp_path, h200, num_chunks):
    shape = TransformerShape.from_name("gpt3-1.3b")
    profile = Profile.synthetic(
        shape, h200, num_stages=2, num_chunks=num_chunks, clocks_mhz=[1980, 1500, 990]
    )
    path = tmp_path / "profile.csv"
    profile.to_csv(path)
    header = path.read_text().splitlines()[0]
    assert header == HEADER.strip() + (",chunk" if num_chunks > 1 else "") + ",source"
    loaded = Profile.from_csv(path, gpu_name="h200")  # the file says it is modelled
    assert loaded.keys() == profile.keys()
    assert all(loaded.options(key) == profile.options(key) for key in profile)
    assert (loaded.blocked_power_w, loaded.idle_power_w) == (h200.blocked_power_w, h200.idle_power_w)
    assert loaded.source == "modelled"


def test_perseus_style_csv_with_extra_columns_is_read(tmp_path):
    # Fragment of the zeus pipeline-frequency-optimizer docs (A40), plus an unrelated column.
    path = tmp_path / "a40.csv"
    path.write_text(
        "stage,instruction,frequency,time,energy,rank\n"
        "0,forward,1740,0.0937,28.49,0\n"
        "0,forward,1710,0.0938,28.29,0\n"
        "0,backward,1740,0.2453,69.57,0\n"
    )
    profile = Profile.from_csv(
        path, gpu_name="a40", source="measured", blocked_power_w=70.0, idle_power_w=30.0
    )
    assert profile.source == "measured"
    assert profile.fastest(Work(0, 0, "forward")) == ClockOption(1740, 0.0937, 28.49)
    assert [o.clock_mhz for o in profile.pareto(Work(0, 0, "forward"))] == [1740, 1710]


@pytest.mark.parametrize("source", ["measured", "modelled", "simulated"])
def test_the_csv_carries_its_provenance(tmp_path, h200, source):
    synthetic = Profile.synthetic(TransformerShape.from_name("gpt3-1.3b"), h200, 1, clocks_mhz=[1980, 990])
    options = {key: synthetic.options(key) for key in synthetic}
    path = tmp_path / "profile.csv"
    Profile(options, "h200", source, 100.0, 90.0).to_csv(path)
    assert {line.rsplit(",", 1)[1] for line in path.read_text().splitlines()[1:]} == {source}
    assert Profile.from_csv(path, gpu_name="h200").source == source
    assert Profile.from_csv(path, gpu_name="h200", source=source).source == source
    other = next(name for name in ("measured", "modelled") if name != source)
    with pytest.raises(ValueError, match=f"says its figures are {source}, not {other}"):
        Profile.from_csv(path, gpu_name="h200", source=other)


def test_a_csv_that_does_not_say_needs_a_source(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text(HEADER + "0,forward,1740,0.09,28\n0,backward,1740,0.2,60\n")
    with pytest.raises(ValueError, match="does not say where its figures come from"):
        Profile.from_csv(path, gpu_name="h200")


def test_csv_of_an_unknown_gpu_needs_explicit_powers(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text(HEADER + "0,forward,1740,0.09,28\n0,backward,1740,0.2,60\n")
    with pytest.raises(ValueError, match="unknown GPU spec 'a40'"):
        Profile.from_csv(path, gpu_name="a40")


def test_synthetic_profile_is_modelled_and_covers_every_clock(gpt_profile, h200):
    assert gpt_profile.source == "modelled"
    assert gpt_profile.gpu_name == "h200"
    assert (gpt_profile.blocked_power_w, gpt_profile.idle_power_w) == (
        h200.blocked_power_w,
        h200.idle_power_w,
    )
    assert (gpt_profile.num_stages, gpt_profile.num_chunks) == (4, 1)
    assert len(gpt_profile) == len(gpt_profile.keys()) == 8
    for key in gpt_profile:
        assert {o.clock_mhz for o in gpt_profile.options(key)} == set(h200.sm_clocks_mhz)


def test_synthetic_stages_are_unbalanced_like_real_pipelines(gpt_profile):
    def fastest_s(stage, kind):
        return gpt_profile.fastest(Work(stage, 0, kind)).time_s

    for kind in ("forward", "backward"):
        assert fastest_s(1, kind) == pytest.approx(fastest_s(2, kind))
        assert fastest_s(0, kind) > fastest_s(1, kind)  # embedding
        assert fastest_s(3, kind) > 1.2 * fastest_s(1, kind)  # LM head + loss
    assert fastest_s(1, "backward") == pytest.approx(2 * fastest_s(1, "forward"), rel=0.05)


@pytest.mark.parametrize("key", [Work(1, 0, "backward"), Work(3, 0, "backward"), Work(1, 0, "forward")])
def test_synthetic_energy_falls_then_rises_with_the_clock(gpt_profile, h200, key):
    by_clock = sorted(gpt_profile.options(key), key=lambda o: o.clock_mhz)
    energies = np.array([o.energy_j for o in by_clock])
    best = int(np.argmin(energies))
    assert h200.min_sm_clock_mhz < by_clock[best].clock_mhz < 0.8 * h200.max_sm_clock_mhz
    assert np.all(np.diff(energies[: best + 1]) <= 1e-12)
    assert np.all(np.diff(energies[best:]) >= -1e-12)
    assert energies[best] < 0.9 * energies[-1]


def test_synthetic_gemm_throughput_is_realistic(gpt_profile, h200):
    shape = TransformerShape.from_name("gpt3-1.3b", micro_batch_size=4)
    layers_per_stage = shape.num_layers // 4
    flops = layers_per_stage * (shape.layer_forward_gemm_flops() + shape.layer_forward_attention_flops())
    achieved = flops / gpt_profile.fastest(Work(1, 0, "forward")).time_s / (h200.peak_bf16_tflops * 1e12)
    assert 0.45 < achieved < 0.75


def test_synthetic_with_virtual_chunks_puts_embedding_and_head_on_the_right_chunks(h200):
    profile = Profile.synthetic(TransformerShape.from_name("gpt3-1.3b"), h200, num_stages=2, num_chunks=2)
    assert (profile.num_stages, profile.num_chunks) == (2, 2)
    fastest = {key: profile.fastest(key).time_s for key in profile}
    assert fastest[Work(0, 0, "forward")] > fastest[Work(0, 1, "forward")]
    assert fastest[Work(1, 1, "forward")] > fastest[Work(1, 0, "forward")]
    assert fastest[Work(1, 0, "forward")] == pytest.approx(fastest[Work(0, 1, "forward")])


def test_synthetic_rejects_unsupported_clocks_and_uneven_layers(h200):
    shape = TransformerShape.from_name("gpt3-1.3b")
    with pytest.raises(ValueError, match=r"\[1234\] are not supported"):
        Profile.synthetic(shape, h200, num_stages=2, clocks_mhz=[1980, 1234])
    with pytest.raises(ValueError, match="do not split evenly"):
        Profile.synthetic(shape, h200, num_stages=5)


def test_tensor_parallelism_divides_the_compute(h200):
    single = Profile.synthetic(TransformerShape.from_name("llama-7b"), h200, num_stages=4, clocks_mhz=[1980])
    sharded = Profile.synthetic(
        TransformerShape.from_name("llama-7b", tensor_parallel=4), h200, num_stages=4, clocks_mhz=[1980]
    )
    ratio = single.fastest(Work(1, 0, "forward")).time_s / sharded.fastest(Work(1, 0, "forward")).time_s
    assert 2.0 < ratio < 4.0  # replicated norms/residuals and TP all-reduces keep it below 4x


def test_transformer_flops_match_the_standard_formula():
    shape = TransformerShape.from_name("gpt3-1.3b")
    b, s, h = shape.micro_batch_size, shape.seq_length, shape.hidden_size
    assert shape.layer_forward_gemm_flops() == 24 * b * s * h * h
    assert shape.layer_forward_attention_flops() == 4 * b * s * s * h
    assert (shape.num_layers, shape.hidden_size, shape.num_attention_heads, shape.vocab_size) == (
        24,
        2048,
        16,
        50257,
    )


def test_known_shapes_and_unknown_name():
    assert {"gpt3-1.3b", "llama-7b", "llama-70b"} <= set(KNOWN_SHAPES)
    llama70 = TransformerShape.from_name("llama-70b", tensor_parallel=8)
    assert (llama70.num_layers, llama70.hidden_size, llama70.query_groups, llama70.tensor_parallel) == (
        80,
        8192,
        8,
        8,
    )
    with pytest.raises(ValueError, match=r"unknown model shape 'gpt5'.*gpt3-1.3b.*llama-70b"):
        TransformerShape.from_name("gpt5")
    with pytest.raises(ValueError, match="micro_batch_size must be positive"):
        TransformerShape.from_name("gpt3-1.3b", micro_batch_size=0)
