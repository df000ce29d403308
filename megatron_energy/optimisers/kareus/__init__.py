"""Kareus-style optimiser: when each collective launches and on how many SMs (CTAs), jointly with the clock.

Layer 2 (with ``perseus/``): pure Python, no torch, megatron or NVML.

- :mod:`.collectives`: the naming scheme, process groups, bytes, launch points and CTA budgets (the contract
  with the runtime);
- :mod:`.choices`: choices per (stage, collective class) -> overlap schedule, clocks and plan actions;
- :mod:`.search`: Optuna multi-objective search, model-seeded and refinable by measurement;
- :mod:`.search_cache`: search results by job fingerprint;
- :mod:`.collective_optimiser`: :class:`.collective_optimiser.KareusOptimiser` (``--energy-mode kareus``,
  and its part of ``all``).

The model it plans with lives in ``sim/contention.py`` and ``sim/overlap.py``.
"""
