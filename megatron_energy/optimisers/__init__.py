"""The optimisers behind one interface, and how ``--energy-mode`` chooses them.

- :mod:`.interface`: :class:`~megatron_energy.optimisers.interface.Optimiser`, what an optimiser asks of
  profiling (``ProfileRequest``) and what it is given to plan (``PlanningJob``);
- :mod:`.registry`: ``--energy-mode`` -> optimiser (the released ones by name, plugins by entry point);
- :mod:`.composition`: ``all``, the released optimisers composed, never worse than its best part;
- :mod:`.perseus` (clock per pipeline instruction), :mod:`.kareus` (collectives' launch points and CTA
  budgets), :mod:`.kernel` (clock per phase of kernels, ``--energy-mode kernel``): the concrete optimisers,
  each a leaf (none imports another), reached from below the command layer only through the registry.
"""
