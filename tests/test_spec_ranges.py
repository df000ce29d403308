"""A GPU spec's declared ranges: read from YAML, checked against the spec, and the variants at their ends."""

import dataclasses
from pathlib import Path

import pytest
import yaml

from megatron_energy.dvfs.spec import available_gpu_specs, config_root, load_gpu_spec
from megatron_energy.dvfs.spec_ranges import ranged_value, ranges_problem, spec_at


def _write(directory: Path, ranges: object, **sources: str) -> Path:
    """h200.yaml under another name, with ``ranges`` and extra range sources."""
    raw = yaml.safe_load((config_root() / "gpus" / "h200.yaml").read_text())
    raw["name"] = "ranged"
    raw["ranges"] = ranges
    raw["sources"] = {k: v for k, v in raw["sources"].items() if not k.startswith("ranges.")} | sources
    path = directory / "ranged.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize("name", available_gpu_specs())
def test_shipped_ranges_hold_their_values_and_keep_them(name):
    spec = load_gpu_spec(name)
    for key, (low, high) in spec.ranges.items():
        assert low <= ranged_value(spec, key) <= high
    assert spec == dataclasses.replace(spec, ranges={})  # the ranges change no figure


def test_hopper_specs_range_the_switch_latency_and_memory_power():
    for name in ("h100-sxm", "h200"):
        ranges = load_gpu_spec(name).ranges
        assert ranges["switch_latency_s"][0] <= 0.006 and ranges["switch_latency_s"][1] >= 0.02
        assert "memory_power_w" in ranges


def test_a_range_is_read_with_its_source(tmp_path):
    path = _write(tmp_path, {"memory_power_w": [100, 170]}, **{"ranges.memory_power_w": "why"})
    spec = load_gpu_spec(str(path))
    assert spec.ranges == {"memory_power_w": (100.0, 170.0)}
    assert spec_at(spec, {"memory_power_w": 170}).memory_power_w == 170


@pytest.mark.parametrize(
    ("ranges", "message"),
    [
        ({"memory_power": [100, 170]}, "'memory_power' names no field"),
        ({"memory_power_w": [170, 100]}, "low 170 above high 100"),
        ({"memory_power_w": [140, 170]}, "'memory_power_w' is 135, outside its range \\[140, 170\\]"),
        ({"sm_count": [100, 140]}, "'sm_count' is not a real-valued figure"),
        ({"memory_power_w": [100]}, "expected \\[low, high\\]"),
        ({"memory_power_w.hbm": [100, 170]}, "field 'memory_power_w' has no entry 'hbm'"),
        ({"idle_power_w": [100, 130]}, "'idle_power_w' at 130 makes an unsound spec: .*need idle <= blocked"),
    ],
)
def test_bad_ranges_are_refused_naming_the_file(tmp_path, ranges, message):
    key = next(iter(ranges))
    path = _write(tmp_path, ranges, **{f"ranges.{key}": "why"})
    with pytest.raises(ValueError, match=message) as error:
        load_gpu_spec(str(path))
    assert str(path) in str(error.value)


def test_a_range_without_its_source_is_refused(tmp_path):
    path = _write(tmp_path, {"memory_power_w": [100, 170]})
    with pytest.raises(ValueError, match=r"lacks an entry for \['ranges\.memory_power_w'\]"):
        load_gpu_spec(str(path))


def test_an_entry_of_a_mapping_field_is_varied_through_a_copy_of_the_mapping():
    base = load_gpu_spec("h200")
    spec = dataclasses.replace(
        base,
        class_activity={"gemm_fp16": 1.0, "gemm_fp8": 0.8},
        ranges={"class_activity.gemm_fp16": (0.9, 1.1)},
    )
    variant = spec_at(spec, {"class_activity.gemm_fp16": 1.1})
    assert variant.class_activity == {"gemm_fp16": 1.1, "gemm_fp8": 0.8}
    assert spec.class_activity["gemm_fp16"] == 1.0
    outside = dataclasses.replace(
        base, class_activity={"gemm_fp8": 0.8}, ranges={"class_activity.gemm_fp8": (0.9, 1.1)}
    )
    assert "'class_activity.gemm_fp8' is 0.8, outside its range" in str(ranges_problem(outside))
