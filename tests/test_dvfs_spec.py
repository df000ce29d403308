import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from megatron_energy.dvfs.spec import (
    CONFIG_DIR_ENV,
    DESCRIPTIVE_FIELDS,
    GpuSpec,
    available_gpu_specs,
    config_root,
    load_gpu_spec,
)

CONTRACT_SPECS = ["a100-sxm-40gb", "a100-sxm-80gb", "b200", "h100-sxm", "h200"]


def test_all_contract_specs_are_available():
    assert set(CONTRACT_SPECS) <= set(available_gpu_specs())


@pytest.mark.parametrize("name", CONTRACT_SPECS)
def test_every_spec_loads_consistently_and_sources_every_number(name):
    spec = load_gpu_spec(name)
    assert spec.name == name
    assert list(spec.sm_clocks_mhz) == sorted(spec.sm_clocks_mhz, reverse=True)
    assert spec.max_sm_clock_mhz == spec.sm_clocks_mhz[0] == spec.default_sm_clock_mhz
    assert spec.idle_power_w <= spec.blocked_power_w < spec.power_limit_w
    numeric = {f.name for f in dataclasses.fields(GpuSpec)} - DESCRIPTIVE_FIELDS
    assert numeric <= set(spec.sources)
    assert {f"ranges.{key}" for key in spec.ranges} <= set(spec.sources)
    assert all(text.strip() for text in spec.sources.values())


def test_h200_matches_the_measured_facts():
    spec = load_gpu_spec("h200")
    assert len(spec.sm_clocks_mhz) == 110
    assert (spec.max_sm_clock_mhz, spec.min_sm_clock_mhz) == (1980, 345)
    assert {a - b for a, b in zip(spec.sm_clocks_mhz, spec.sm_clocks_mhz[1:], strict=False)} == {15}
    assert spec.memory_clocks_mhz == (3201, 2201)
    assert spec.power_limit_w == 700
    assert spec.energy_counter_period_s == pytest.approx(0.1)
    assert 0.006 <= spec.switch_latency_s <= 0.1
    assert "measured" in spec.sources["idle_power_w"]
    assert "calibrated" in spec.sources["dynamic_power_max_w"]


def test_a100_matches_published_facts():
    spec = load_gpu_spec("a100-sxm-40gb")
    assert (spec.max_sm_clock_mhz, spec.min_sm_clock_mhz, len(spec.sm_clocks_mhz)) == (1410, 210, 81)
    assert spec.power_limit_w == 400
    assert spec.blocked_power_w == 85
    assert "Kareus" in spec.sources["blocked_power_w"]


@pytest.mark.parametrize(
    ("requested", "expected"),
    [(1980, 1980), (1979, 1980), (1000, 1005), (997.5, 1005), (997.4, 990), (5000, 1980), (0, 345)],
)
def test_snap_sm_clock_picks_nearest_and_breaks_ties_upwards(requested, expected):
    assert load_gpu_spec("h200").snap_sm_clock(requested) == expected


def test_unknown_spec_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown GPU spec 'v100'.*h200"):
        load_gpu_spec("v100")


def _write_spec(directory: Path, name: str, **changes) -> Path:
    raw = yaml.safe_load((config_root() / "gpus" / "h200.yaml").read_text())
    raw["name"] = name
    for key, value in changes.items():
        if value is None:
            raw.pop(key)
        else:
            raw[key] = value
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_a_spec_file_can_be_loaded_by_path_with_an_explicit_clock_list(tmp_path):
    path = _write_spec(tmp_path, "custom", sm_clocks_mhz=[600, 1980, 1500], default_sm_clock_mhz=1980)
    spec = load_gpu_spec(str(path))
    assert spec.sm_clocks_mhz == (1980, 1500, 600)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"power_limit_w": None}, "missing field.*power_limit_w"),
        ({"power_limit_w": "lots"}, "field 'power_limit_w': expected a number"),
        ({"default_sm_clock_mhz": 1981.5}, "field 'default_sm_clock_mhz': expected an integer"),
        ({"sm_clocks_mhz": {"max": 1980, "min": 340, "step": 15}}, "field 'sm_clocks_mhz'.*whole number"),
        ({"sm_clocks_mhz": {"max": 1980}}, "field 'sm_clocks_mhz'.*max, min, step"),
        ({"bogus_w": 3}, "unknown field.*bogus_w"),
        ({"default_sm_clock_mhz": 1234}, "default_sm_clock_mhz must be one of sm_clocks_mhz"),
        ({"idle_power_w": 900}, "idle_power_w < power_limit_w"),
    ],
)
def test_malformed_spec_names_the_file_and_field(tmp_path, changes, message):
    path = _write_spec(tmp_path, "broken", **changes)
    with pytest.raises(ValueError, match=message) as error:
        load_gpu_spec(str(path))
    assert str(path) in str(error.value)


def test_a_number_without_a_source_is_rejected(tmp_path):
    raw_sources = yaml.safe_load((config_root() / "gpus" / "h200.yaml").read_text())["sources"]
    del raw_sources["idle_power_w"]
    path = _write_spec(tmp_path, "unsourced", sources=raw_sources)
    with pytest.raises(ValueError, match="'sources' lacks an entry for \\['idle_power_w'\\]"):
        load_gpu_spec(str(path))


def test_invalid_yaml_and_name_mismatch_are_reported(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ValueError, match=r"bad\.yaml: not valid YAML"):
        load_gpu_spec(str(bad))
    path = _write_spec(tmp_path, "renamed")
    path.write_text(path.read_text().replace("name: renamed", "name: other"))
    with pytest.raises(ValueError, match="field 'name' is 'other'"):
        load_gpu_spec(str(path))


def test_config_root_honours_the_environment(tmp_path, monkeypatch):
    (tmp_path / "gpus").mkdir()
    _write_spec(tmp_path / "gpus", "only-one")
    monkeypatch.setenv(CONFIG_DIR_ENV, str(tmp_path))
    assert config_root() == tmp_path
    assert available_gpu_specs() == ["only-one"]
    monkeypatch.setenv(CONFIG_DIR_ENV, str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match=CONFIG_DIR_ENV):
        config_root()


@pytest.mark.slow
def test_planning_modules_import_no_gpu_or_training_stack():
    code = (
        "import sys, megatron_energy.dvfs, megatron_energy.dvfs.spec, megatron_energy.dvfs.model, "
        "megatron_energy.pipeline.profile\n"
        "heavy = [m for m in ('torch', 'zeus', 'pynvml', 'megatron') if m in sys.modules]\n"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.slow
def test_a_spec_loaded_by_path_is_found_by_its_name_here_and_in_child_processes(tmp_path, monkeypatch):
    """A calibrated spec outside configs/gpus: profiles and plans name it, the planner child looks it up."""
    import subprocess
    import sys

    from megatron_energy.dvfs.spec import SPEC_DIRS_ENV

    monkeypatch.delenv(SPEC_DIRS_ENV, raising=False)
    source = (config_root() / "gpus" / "h100-sxm.yaml").read_text()
    path = tmp_path / "mine" / "h100-sxm.mine.yaml"
    path.parent.mkdir()
    path.write_text(source.replace("name: h100-sxm\n", "name: h100-sxm.mine\n"))
    with pytest.raises(ValueError, match=r"unknown GPU spec 'h100-sxm\.mine'"):
        load_gpu_spec("h100-sxm.mine")
    assert load_gpu_spec(str(path)).name == "h100-sxm.mine"
    assert load_gpu_spec("h100-sxm.mine") == load_gpu_spec(str(path))
    assert "h100-sxm.mine" in available_gpu_specs()
    child = "from megatron_energy.dvfs.spec import load_gpu_spec; print(load_gpu_spec('h100-sxm.mine').name)"
    assert (
        subprocess.run([sys.executable, "-c", child], capture_output=True, text=True).stdout
        == "h100-sxm.mine\n"
    )
