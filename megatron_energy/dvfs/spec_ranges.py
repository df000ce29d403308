"""What a GPU spec does not pin down: its ``ranges`` map, and the variant specs at their ends.

A spec YAML may give ``ranges``: for a number the spec only assumes, or whose calibrations disagree, the
interval ``[low, high]`` it may lie in, with its reason under ``sources`` as ``ranges.<key>``. A key is a
real-valued :class:`~megatron_energy.dvfs.spec.GpuSpec` field (``switch_latency_s``) or ``<field>.<entry>``
for one entry of a mapping-valued field (``class_activity.gemm_fp8``). The spec's own value lies inside its
range (checked where a spec file is read: :func:`ranges_problem`); the spec keeps that value, so plans
made from it do not change.

:func:`spec_at` gives the spec with ranged values moved (through ``dataclasses.replace``, so a variant passes
every check a spec does); ``sim.saving_band`` prices a plan under such variants.

Pure Python: no torch, megatron, zeus or NVML imports.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, Protocol

Ranges = Mapping[str, tuple[float, float]]
"""Range key -> ``(low, high)``."""


class Ranged(Protocol):
    """A spec with declared ranges (:class:`~megatron_energy.dvfs.spec.GpuSpec`, a dataclass)."""

    @property
    def ranges(self) -> Ranges:
        """Range key -> ``(low, high)``."""
        ...


SOURCE_PREFIX = "ranges."
"""A range's reason is ``sources["ranges.<key>"]``."""


def ranged_value(spec: Any, key: str) -> object:
    """The spec's own value under a range key (a field, or an entry of a mapping field).

    Raises:
        ValueError: The key names no field, or no entry of a mapping field.
    """
    name, _, entry = key.partition(".")
    if name in ("ranges", "sources") or not hasattr(spec, name):
        raise ValueError(f"ranges: {key!r} names no field of the spec")
    value = getattr(spec, name)
    if not entry:
        return value
    if not isinstance(value, Mapping) or entry not in value:
        raise ValueError(f"ranges: {key!r}: field {name!r} has no entry {entry!r}")
    return value[entry]


def range_problem(spec: Any, key: str, bounds: tuple[float, float]) -> str | None:
    """Why ``bounds`` is no range of ``key`` for ``spec``; ``None`` when it is one.

    A range covers a real-valued figure (not a count, a clock list or a name), its ends are finite with
    ``low <= high``, and the spec's own value lies inside it.
    """
    try:
        value = ranged_value(spec, key)
    except ValueError as error:
        return str(error)
    if isinstance(value, bool) or not isinstance(value, float):
        return f"ranges: {key!r} is not a real-valued figure ({value!r}); only those take a range"
    low, high = bounds
    if not (math.isfinite(low) and math.isfinite(high)):
        return f"ranges: {key!r} needs finite ends, got [{low!r}, {high!r}]"
    if low > high:
        return f"ranges: {key!r} has low {low:g} above high {high:g}"
    if not low <= value <= high:
        return f"ranges: {key!r} is {value:g}, outside its range [{low:g}, {high:g}]"
    return None


def ranges_problem(spec: Ranged) -> str | None:
    """The first reason why ``spec``'s ranges do not describe it; ``None`` when they do.

    Every range is one (:func:`range_problem`) and each of its ends makes a sound spec (e.g. an idle power
    that stays below the blocked power).
    """
    for key, bounds in spec.ranges.items():
        problem = range_problem(spec, key, bounds)
        if problem is not None:
            return problem
        for end in bounds:
            try:
                spec_at(spec, {key: end})
            except ValueError as error:
                return f"ranges: {key!r} at {end:g} makes an unsound spec: {error}"
    return None


def spec_at[SpecT: Ranged](spec: SpecT, values: Mapping[str, float]) -> SpecT:
    """The spec with each ranged key set to its value in ``values`` (a variant of ``spec``).

    Args:
        spec: The spec.
        values: Range key -> the value the variant takes (normally an end of the key's range).

    Returns:
        The variant, checked as every spec is.

    Raises:
        ValueError: A key names nothing in the spec, or the variant fails the spec's checks.
    """
    changes: dict[str, object] = {}
    for key, value in values.items():
        ranged_value(spec, key)  # the key exists
        name, _, entry = key.partition(".")
        if entry:
            mapping = dict(changes.get(name, getattr(spec, name)))  # type: ignore[call-overload]
            mapping[entry] = value
            changes[name] = mapping
        else:
            changes[name] = value
    return dataclasses.replace(spec, **changes)  # type: ignore[type-var]
