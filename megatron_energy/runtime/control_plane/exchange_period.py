"""How often a staged exchange may run (K), from the job's group sizes, the hop latency and the iteration.

The model (fitted by ``lab/bench_control_plane.py`` over gloo): an all-reduce of a few floats over a
group of ``n`` ranks takes ``2 (n - 1)`` hops (``all_reduce_hops``), each of ``hop_s``; an exchange over the
job's groups (``runtime.control_plane.staged_exchange``) costs the sum over its links. The rule for K:

- each link is read one step after it starts, so it must complete within an iteration: a link longer than
  ``iteration_s`` is read ``ceil(link / iteration_s)`` steps later, and an exchange takes the sum of its
  links' steps (its *cycle*); K is at least the cycle, so exchanges never overlap;
- the control plane's modelled cost amortised over the steps is at most ``BUDGET_S`` (1 ms a step), shared
  by the ``EXCHANGES`` exchanges a run-phase step may carry (the replicas' paces and the energy line,
  ``runtime.energy_log.energy_logger``): K is at least ``ceil(cost / (BUDGET_S / EXCHANGES))``.

So ``K = max(cycle, ceil(cost / EXCHANGE_BUDGET_S))``. Every rank computes the same K from the same figures
(the group sizes, and an iteration time every rank holds: the plan's, or the job's stock one).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

HOP_S = 75e-6
"""Seconds per hop of a small gloo all-reduce assumed for K: the upper end of the 20-75 µs a hop over a
datacenter network takes (modelled); this machine's loopback measures its own (the benchmark's fit)."""

BUDGET_S = 1e-3
"""The most the control plane's exchanges may cost per step together, amortised (modelled)."""

EXCHANGES = 2
"""Exchanges that share the budget: the replicas' paces and the energy line."""

EXCHANGE_BUDGET_S = BUDGET_S / EXCHANGES
"""The most one exchange may cost per step, amortised over the K steps between two (modelled)."""


def all_reduce_hops(ranks: int) -> int:
    """Hops of a small all-reduce over ``ranks`` ranks (ring: reduce-scatter then all-gather)."""
    return 2 * (ranks - 1)


def exchange_cost_s(group_sizes: Sequence[int], hop_s: float = HOP_S) -> float:
    """The modelled time of one exchange: an all-reduce over each group in turn."""
    return hop_s * sum(all_reduce_hops(size) for size in group_sizes)


def exchange_period(
    group_sizes: Sequence[int],
    iteration_s: float | None,
    hop_s: float = HOP_S,
    budget_s: float = EXCHANGE_BUDGET_S,
) -> int:
    """K, the steps between two exchanges over ``group_sizes`` (the module docstring's rule).

    Args:
        group_sizes: The sizes of the groups the exchange reduces over, in turn.
        iteration_s: The job's iteration time; ``None`` or not positive: unknown, each link takes one step.
        hop_s: Seconds per hop.
        budget_s: The most the exchange may cost per step, amortised.
    """
    links = [exchange_cost_s([size], hop_s) for size in group_sizes if size > 1]
    step_s = iteration_s if iteration_s is not None and iteration_s > 0 else math.inf
    cycle = sum(max(1, math.ceil(link / step_s)) for link in links)
    return max(1, cycle, math.ceil(sum(links) / budget_s))
