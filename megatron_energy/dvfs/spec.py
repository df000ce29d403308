"""GPU specifications: clock grids, power figures and time/power-model parameters, loaded from YAML.

Each supported GPU has one file ``configs/gpus/<name>.yaml`` holding every :class:`GpuSpec` field and a
``sources`` map that says where each number comes from (datasheet, paper, measurement or an explicit
assumption). ``sm_clocks_mhz`` may be written either as an explicit list (as ``nvidia-smi -q -d
SUPPORTED_CLOCKS`` prints it) or as a regular grid ``{max: 1980, min: 345, step: 15}``. An optional ``ranges``
map declares what the spec does not pin down (``dvfs.spec_ranges``); each entry's reason is the ``sources``
entry ``ranges.<key>``.

Pure Python + PyYAML: no torch, megatron, zeus or NVML imports.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from megatron_energy.dvfs.kernel_classes import KernelClass, parse_activities
from megatron_energy.dvfs.spec_ranges import SOURCE_PREFIX, Ranges, ranges_problem

CONFIG_DIR_ENV = "MEGATRON_ENERGY_CONFIG_DIR"

SPEC_DIRS_ENV = "MEGATRON_ENERGY_SPEC_DIRS"
"""Folders of spec files loaded by path in this process (``os.pathsep``-separated): a spec written by
``megatron-energy calibrate`` and given as ``--energy-gpu-spec PATH.yaml`` is then found by its name too, here
and in the processes this one starts (the planner child reads the profile's GPU name)."""

# Default memory saturation clock as a fraction of the maximum: Spaan et al. found memory-bound kernels lose
# (almost) nothing down to 30-60 % of f_max.
DEFAULT_SATURATION_FRACTION = 0.45

DESCRIPTIVE_FIELDS = frozenset({"name", "display_name", "sources", "ranges"})
"""Fields that are no figure of the GPU: its names, the figures' sources and their declared ranges (which
need no source of their own: each range entry has one)."""

OPTIONAL_FILE_FIELDS = frozenset({"ranges"})
"""Fields a spec file may leave out."""


@dataclass(frozen=True)
class GpuSpec:
    """Static description of one GPU model, plus the parameters of the time/power model.

    The power-model parameters are explained in :mod:`megatron_energy.dvfs.model`.

    Attributes:
        name: Short name, the YAML file stem (e.g. ``"h200"``).
        display_name: Marketing name (e.g. ``"NVIDIA H200 SXM 141GB"``).
        sm_clocks_mhz: Supported SM clocks, descending (maximum first).
        memory_clocks_mhz: Supported memory clocks, descending.
        default_sm_clock_mhz: The clock the GPU runs "stock" (maximum boost).
        power_limit_w: Default power limit (the cap the power controller enforces).
        idle_power_w: Power when nothing runs (warm, P0); also the static part of busy power.
        blocked_power_w: Power while blocked in an NCCL/P2P wait (a spinning kernel).
        switch_latency_s: SM-clock switch latency (request issued -> new clock in effect).
        energy_counter_period_s: Update period of the cumulative energy counter.
        peak_bf16_tflops: Dense BF16 tensor-core peak at the maximum SM clock.
        memory_bandwidth_gbps: Peak memory bandwidth, GB/s.
        p2p_bandwidth_gbps: Bandwidth of pipeline send/recv between stages, GB/s per direction.
        p2p_latency_s: Latency of one pipeline send/recv.
        voltage_min_v: Core voltage at and below ``voltage_knee_mhz``.
        voltage_max_v: Core voltage at the maximum SM clock.
        voltage_knee_mhz: Clock above which voltage rises linearly from voltage_min_v to voltage_max_v.
        dynamic_power_max_w: Dynamic power of fully compute-bound work at the maximum clock and voltage.
        sources: Field name -> where its value comes from.
        memory_saturation_mhz: SM clock below which memory-bound work slows down (issue rate and L2 live in
            the core clock domain); defaults to 0.45 x the maximum clock.
        memory_power_w: Extra (above idle) memory power while memory-bound work streams at full bandwidth;
            0 folds it into the core terms.
        memory_core_activity: Core activity of memory-bound work relative to compute-bound work (0..1).
        prior_compute_fraction: Default fraction of busy time that is compute-bound, used when a work
            profile cannot be fitted (measurements at a single clock only).
        sm_count: Streaming multiprocessors (a collective's CTAs each take one; ``sim.contention``).
        nvlink_bandwidth_gbps: NVLink/NVSwitch bandwidth per GPU and direction, GB/s (inside a node).
        pcie_bandwidth_gbps: PCIe bandwidth per GPU and direction, GB/s (host link; GPUs without NVLink).
        nic_bandwidth_gbps: Network (InfiniBand/RoCE) bandwidth of the GPU's NIC per direction, GB/s, on the
            reference system (one NIC per GPU); collectives whose group spans nodes cross it.
        cta_bandwidth_gbps: Bandwidth one CTA (one NCCL channel) of a collective kernel drives; a collective
            with ``c`` CTAs moves at ``min(link, c x this)`` (``sim.contention``).
        class_activity: Dynamic power of each compute kernel class relative to the bf16 matrix product that
            ``dynamic_power_max_w`` describes (:mod:`megatron_energy.dvfs.kernel_classes`); a class not listed
            has activity 1. Empty: every class draws like the reference.
        memory_idle_power_w: The part of ``idle_power_w`` that scales with the memory clock (HBM background,
            memory controller and PHY at the top memory clock); a lower memory clock ``m`` saves
            ``memory_idle_power_w x (1 - m / m_max)`` of static power.
        workload_activity_scale: The compute activity of a training step's kernels relative to the classes'
            (``class_activity``, measured on large products), for the work the workload model describes
            (``pipeline.workload``): a step's products are smaller and mixed with other kernels. Measured work
            fits its own (``dvfs.model.fit_work_profile``).
        ranges: What the spec does not pin down: range key (a real-valued field, or ``<field>.<entry>`` of a
            mapping field) -> ``(low, high)`` around the spec file's own value (``dvfs.spec_ranges``); empty
            when the spec declares none. A spec derived with other figures keeps them as they are.
    """

    name: str
    display_name: str
    sm_clocks_mhz: tuple[int, ...]
    memory_clocks_mhz: tuple[int, ...]
    default_sm_clock_mhz: int
    power_limit_w: float
    idle_power_w: float
    blocked_power_w: float
    switch_latency_s: float
    energy_counter_period_s: float
    peak_bf16_tflops: float
    memory_bandwidth_gbps: float
    p2p_bandwidth_gbps: float
    p2p_latency_s: float
    voltage_min_v: float
    voltage_max_v: float
    voltage_knee_mhz: float
    dynamic_power_max_w: float
    sources: Mapping[str, str] = field(compare=False, hash=False)
    memory_saturation_mhz: float | None = None
    memory_power_w: float = 0.0
    memory_core_activity: float = 0.3
    prior_compute_fraction: float = 0.7
    sm_count: int = 132
    nvlink_bandwidth_gbps: float = 450.0
    pcie_bandwidth_gbps: float = 64.0
    nic_bandwidth_gbps: float = 50.0
    cta_bandwidth_gbps: float = 24.0
    class_activity: Mapping[KernelClass, float] = field(default_factory=dict, hash=False)
    memory_idle_power_w: float = 0.0
    workload_activity_scale: float = 1.0
    ranges: Ranges = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sm_clocks_mhz", tuple(int(c) for c in self.sm_clocks_mhz))
        object.__setattr__(self, "memory_clocks_mhz", tuple(int(c) for c in self.memory_clocks_mhz))
        object.__setattr__(self, "sources", dict(self.sources))
        object.__setattr__(
            self, "class_activity", parse_activities({str(k): v for k, v in self.class_activity.items()})
        )
        object.__setattr__(
            self, "ranges", {str(key): (float(low), float(high)) for key, (low, high) in self.ranges.items()}
        )
        if self.memory_saturation_mhz is None and self.sm_clocks_mhz:
            object.__setattr__(
                self, "memory_saturation_mhz", DEFAULT_SATURATION_FRACTION * self.max_sm_clock_mhz
            )
        problem = _first_problem(self)
        if problem is not None:
            raise ValueError(f"GPU spec {self.name!r}: {problem}")

    @property
    def max_sm_clock_mhz(self) -> int:
        """The highest supported SM clock."""
        return self.sm_clocks_mhz[0]

    @property
    def min_sm_clock_mhz(self) -> int:
        """The lowest supported SM clock."""
        return self.sm_clocks_mhz[-1]

    @property
    def max_memory_clock_mhz(self) -> int:
        """The highest supported memory clock (the one every GPU runs at stock)."""
        return self.memory_clocks_mhz[0]

    def link_bandwidth_gbps(self, link: str) -> float:
        """Bandwidth per GPU and direction of ``"nvlink"``, ``"pcie"`` or ``"nic"``.

        Raises:
            ValueError: For another link name.
        """
        figures = {
            "nvlink": self.nvlink_bandwidth_gbps,
            "pcie": self.pcie_bandwidth_gbps,
            "nic": self.nic_bandwidth_gbps,
        }
        if link not in figures:
            raise ValueError(f"unknown link {link!r}; known: {', '.join(figures)}")
        return figures[link]

    def snap_sm_clock(self, mhz: float) -> int:
        """Return the supported SM clock nearest to ``mhz`` (ties go to the higher clock)."""
        return min(self.sm_clocks_mhz, key=lambda clock: (abs(clock - mhz), -clock))


def _first_problem(spec: GpuSpec) -> str | None:
    """Return a description of the first inconsistency in ``spec``, or None if it is sound."""
    clocks = spec.sm_clocks_mhz
    checks: list[tuple[bool, str]] = [
        (len(clocks) > 0, "sm_clocks_mhz is empty"),
        (
            all(a > b for a, b in itertools.pairwise(clocks)),
            "sm_clocks_mhz must be strictly descending",
        ),
        (all(c > 0 for c in clocks), "sm_clocks_mhz must be positive"),
        (len(spec.memory_clocks_mhz) > 0, "memory_clocks_mhz is empty"),
        (spec.default_sm_clock_mhz in clocks, "default_sm_clock_mhz must be one of sm_clocks_mhz"),
        (0 < spec.idle_power_w < spec.power_limit_w, "need 0 < idle_power_w < power_limit_w"),
        (
            spec.idle_power_w <= spec.blocked_power_w < spec.power_limit_w,
            "need idle <= blocked < limit power",
        ),
        (0 < spec.voltage_min_v <= spec.voltage_max_v, "need 0 < voltage_min_v <= voltage_max_v"),
    ]
    if clocks:
        checks += [
            (
                clocks[-1] <= spec.voltage_knee_mhz < clocks[0],
                "voltage_knee_mhz must lie in [min, max) clock",
            ),
            (
                clocks[-1] <= (spec.memory_saturation_mhz or 0) <= clocks[0],
                "memory_saturation_mhz must lie in [min, max] clock",
            ),
        ]
    positive = (
        "switch_latency_s",
        "energy_counter_period_s",
        "peak_bf16_tflops",
        "memory_bandwidth_gbps",
        "p2p_bandwidth_gbps",
        "dynamic_power_max_w",
        "sm_count",
        "nvlink_bandwidth_gbps",
        "pcie_bandwidth_gbps",
        "nic_bandwidth_gbps",
        "cta_bandwidth_gbps",
    )
    checks += [(getattr(spec, name) > 0, f"{name} must be positive") for name in positive]
    checks += [
        (spec.p2p_latency_s >= 0, "p2p_latency_s must be non-negative"),
        (spec.memory_power_w >= 0, "memory_power_w must be non-negative"),
        (0 < spec.workload_activity_scale <= 5, "workload_activity_scale must lie in (0, 5]"),
        (
            0 <= spec.memory_idle_power_w < spec.idle_power_w,
            "need 0 <= memory_idle_power_w < idle_power_w",
        ),
        (0 <= spec.memory_core_activity <= 1, "memory_core_activity must lie in [0, 1]"),
        (0 < spec.prior_compute_fraction <= 1, "prior_compute_fraction must lie in (0, 1]"),
    ]
    return next((message for ok, message in checks if not ok), None)


def config_root() -> Path:
    """Return the ``configs/`` directory holding ``gpus/*.yaml``.

    Looked up in order: the directory named by ``$MEGATRON_ENERGY_CONFIG_DIR``; the repository's ``configs/``
    next to the package (editable install or source checkout); ``<sys.prefix>/share/megatron_energy/configs``
    (wheel install).

    Raises:
        FileNotFoundError: If none of these exists.
    """
    override = os.environ.get(CONFIG_DIR_ENV)
    if override:
        path = Path(override)
        if not path.is_dir():
            raise FileNotFoundError(f"${CONFIG_DIR_ENV}={override} is not a directory")
        return path
    candidates = [
        Path(__file__).resolve().parents[2] / "configs",
        Path(sys.prefix) / "share" / "megatron_energy" / "configs",
    ]
    for path in candidates:
        if (path / "gpus").is_dir():
            return path
    raise FileNotFoundError(f"no GPU config directory found; looked in {[str(p) for p in candidates]}")


def available_gpu_specs() -> list[str]:
    """The names of the GPU specs under ``config_root()/gpus`` and beside the specs loaded by path, sorted."""
    folders = [config_root() / "gpus", *_loaded_spec_folders()]
    return sorted({path.stem for folder in folders for path in folder.glob("*.yaml")})


def _loaded_spec_folders() -> list[Path]:
    """The folders of spec files loaded by path (``$MEGATRON_ENERGY_SPEC_DIRS``), in the order loaded."""
    return [Path(folder) for folder in os.environ.get(SPEC_DIRS_ENV, "").split(os.pathsep) if folder]


def _remember_folder(path: Path) -> None:
    """Add ``path``'s folder to ``$MEGATRON_ENERGY_SPEC_DIRS`` so that its spec is found by name too."""
    folder = path.resolve().parent
    if folder != (config_root() / "gpus").resolve() and folder not in _loaded_spec_folders():
        os.environ[SPEC_DIRS_ENV] = os.pathsep.join(map(str, [*_loaded_spec_folders(), folder]))


def load_gpu_spec(name: str) -> GpuSpec:
    """Load a GPU spec by name (``configs/gpus/<name>.yaml``) or from a path to a YAML file.

    A spec loaded by path is found by its name afterwards, in this process and those it starts (its folder
    joins ``$MEGATRON_ENERGY_SPEC_DIRS``): profiles and plans name their GPU spec, and a calibrated spec
    lives outside ``configs/gpus``.

    Args:
        name: A spec name such as ``"h200"``, or a path ending in ``.yaml``/``.yml``.

    Returns:
        The validated spec.

    Raises:
        ValueError: If the name is unknown (the message lists the known names) or the file is malformed
            (the message names the file and the offending field).
    """
    if name.endswith((".yaml", ".yml")):
        path = Path(name)
        if not path.is_file():
            raise ValueError(f"GPU spec file {path} does not exist")
        spec = _spec_from_file(path)
        _remember_folder(path)
        return spec
    candidates = [folder / f"{name}.yaml" for folder in (config_root() / "gpus", *_loaded_spec_folders())]
    path = next((candidate for candidate in candidates if candidate.is_file()), candidates[0])
    if not path.is_file():
        raise ValueError(f"unknown GPU spec {name!r}; known: {', '.join(available_gpu_specs())}")
    return _spec_from_file(path)


def _spec_from_file(path: Path) -> GpuSpec:
    """Parse and validate one spec YAML file."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        raise ValueError(f"{path}: not valid YAML: {error}") from error
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a mapping of GpuSpec fields at the top level")
    fields = {f.name: f for f in dataclasses.fields(GpuSpec)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ValueError(f"{path}: unknown field(s) {unknown}")
    missing = [name for name in fields if name not in raw and name not in OPTIONAL_FILE_FIELDS]
    if missing:
        raise ValueError(f"{path}: missing field(s) {missing}")
    values = {name: _convert_field(path, name, raw[name]) for name in fields if name in raw}
    unsourced = [name for name in fields if name not in DESCRIPTIVE_FIELDS and name not in values["sources"]]
    unsourced += [
        f"{SOURCE_PREFIX}{key}"
        for key in values.get("ranges", {})
        if f"{SOURCE_PREFIX}{key}" not in values["sources"]
    ]
    if unsourced:
        raise ValueError(f"{path}: field 'sources' lacks an entry for {unsourced}")
    if values["name"] != path.stem:
        raise ValueError(f"{path}: field 'name' is {values['name']!r} but the file is named {path.stem!r}")
    try:
        spec = GpuSpec(**values)
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from error
    problem = ranges_problem(spec)
    if problem is not None:
        raise ValueError(f"{path}: {problem}")
    return spec


def _convert_field(path: Path, name: str, value: Any) -> Any:
    """Convert one YAML value to the type of GpuSpec field ``name``; ValueError names file and field."""
    try:
        if name in ("name", "display_name"):
            if not isinstance(value, str) or not value:
                raise TypeError("expected a non-empty string")
            return value
        if name == "sources":
            if not isinstance(value, dict) or not all(isinstance(v, str) and v for v in value.values()):
                raise TypeError("expected a mapping of field name to a non-empty description")
            return {str(k): v for k, v in value.items()}
        if name == "ranges":
            return _ranges(value)
        if name == "sm_clocks_mhz":
            return _clock_grid(value)
        if name == "memory_clocks_mhz":
            return tuple(sorted((_integer(v) for v in value), reverse=True))
        if name == "class_activity":
            if not isinstance(value, dict):
                raise TypeError("expected a mapping of kernel class to activity")
            return parse_activities(value)
        if name in ("default_sm_clock_mhz", "sm_count"):
            return _integer(value)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"expected a number, got {value!r}")
        return float(value)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{path}: field {name!r}: {error}") from error


def _ranges(value: Any) -> dict[str, tuple[float, float]]:
    """A ``ranges`` map: key -> ``[low, high]`` of two numbers (the spec checks them against its values)."""
    if not isinstance(value, dict):
        raise TypeError(f"expected a mapping of field name to [low, high], got {value!r}")
    ranges = {}
    for key, bounds in value.items():
        if (
            not isinstance(bounds, list)
            or len(bounds) != 2
            or any(isinstance(end, bool) or not isinstance(end, int | float) for end in bounds)
        ):
            raise TypeError(f"entry {key!r}: expected [low, high] (two numbers), got {bounds!r}")
        ranges[str(key)] = (float(bounds[0]), float(bounds[1]))
    return ranges


def _integer(value: Any) -> int:
    """Return ``value`` as an int, rejecting booleans, fractions and non-numbers."""
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
        raise TypeError(f"expected an integer, got {value!r}")
    return int(value)


def _clock_grid(value: Any) -> tuple[int, ...]:
    """Expand a clock list or a ``{max, min, step}`` grid to a descending tuple of MHz."""
    if isinstance(value, dict):
        if set(value) != {"max", "min", "step"}:
            raise TypeError(f"a clock grid needs exactly the keys max, min, step; got {sorted(value)}")
        top, bottom, step = (_integer(value[key]) for key in ("max", "min", "step"))
        if step <= 0 or bottom > top or (top - bottom) % step:
            raise ValueError(f"grid max={top} min={bottom} step={step} is not a whole number of steps")
        return tuple(range(top, bottom - 1, -step))
    if isinstance(value, list):
        return tuple(sorted((_integer(v) for v in value), reverse=True))
    raise TypeError(f"expected a list of clocks or a {{max, min, step}} grid, got {value!r}")
