"""Phase-level (kernel-group) clocks under real switch latency: the ``kernel`` optimiser.

A *phase* is a run of kernels of one class (compute-, memory- or communication-bound) inside a pipeline
instruction or outside instructions (gradient sync, optimizer step). Modules, one job each:

- :mod:`.timeline`: kernels, their roofline class, and grouping a kernel timeline into phases;
- :mod:`.merge`: merging phases shorter than the switch latency allows;
- :mod:`.modelled`: phases of an instruction from a *modelled* per-class split (until the runtime measures
  kernel timelines, which :class:`~megatron_energy.optimisers.interface.PlanningJob` can then carry);
- :mod:`.allocate`: an instruction's time budget distributed over its phases (convex, per-class response
  from the GPU spec's model);
- :mod:`.switch_times`: when to request each switch so no deadline is missed, and the latency-aware
  simulation;
- :mod:`.sequence_plan`: one instruction's (or the tail's) phase plan;
- :mod:`.phase_optimiser`: the ``kernel`` optimiser.

Layer 2 with ``perseus/``: pure Python + numpy/scipy, no torch, megatron or NVML.
"""
