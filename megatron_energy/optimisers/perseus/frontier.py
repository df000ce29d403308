"""The iteration-time–energy frontier of a pipeline iteration: exact relaxation, rounding, local search.

Energy is accounted exactly as :mod:`megatron_energy.sim.simulator` does. With ``d_i`` the duration of compute
node ``i`` (energy ``e_i(d_i)``), ``end_s`` the end of stage ``s``'s last compute node and ``T`` the iteration
time, one iteration costs::

    E = Σ_i (e_i(d_i) − P_blocked·d_i) + Σ_s (P_blocked − P_idle)·end_s + S·P_idle·T + C

where ``C`` (``Simulator.tail_offset_j``) is what a measured iteration tail's energy adds beyond idle power
over it: a constant of the job, 0 for a modelled tail, which moves every energy and bound alike.

**Relaxation.** Each instruction's options are replaced by the lower convex hull of their (time, energy)
points, which makes ``e_i`` convex and piecewise linear. Write ``d_i = t_i0 + Σ_k δ_ik`` with one variable
per hull segment (``0 ≤ δ_ik ≤`` its length, cost = its slope). Convexity makes the solver fill segments in
order, so this incremental form equals the epigraph form without its extra rows. With an event time ``τ_v``
per node and ``τ_v ≥ τ_u + d_u`` per edge, minimising ``E`` subject to ``T ≤ deadline`` is a linear program.
Its optimum is a lower bound on the energy of every plan that meets the deadline, since every real plan is a
feasible point whose energy lies on or above the hulls. A transfer (a fixed node between one predecessor
and one successor) only relays its edges, so it is bypassed: one row ``τ_v ≥ τ_u + d_u + d_transfer``
instead of two, the same optimum. The program is built once; between deadlines only the bound on ``T``
changes, and HiGHS' dual simplex restarts from the previous basis; the first solve starts from a longest-path
tree (:mod:`megatron_energy.optimisers.perseus.starting_basis`), which has every event time basic already.

**Rounding.** A pass in topological order gives every instruction the option of least marginal cost
(``e − P·t``) that still ends by the latest end the relaxed schedule allows, so the deadline holds by
construction and slack freed by earlier instructions is handed on.

**Sweep.** Deadlines are solved from the largest down, so each LP restarts from a nearby basis. A plan for one
deadline meets every larger one, so each point holds the least-energy plan found within its deadline.
(Starting the local search from the previous deadline's plan instead of the rounding was tried: it ends
higher, the search keeps the old plan's critical structure.) On a DAG of more than ``EXACT_LP_INSTRUCTIONS``
instructions, where the LP dominates the sweep, it is solved at ``LARGE_LP_POINTS`` deadlines only, spaced
quadratically from the fastest (the optimum bends most there). Between them the relaxed solution is
interpolated (a convex combination of feasible solutions is feasible for the combined deadline) and rounded
as usual, and the bound is a dual one: the better of the best tangent of the solved optima (the optimum is
convex in the deadline and the dual of the deadline gives its slope, so every tangent lies below it) and the
Lagrangian bound (:meth:`FrontierSolver.dual_bound_j`) of the two neighbouring solves' row multipliers,
interpolated like the solution. Any non-negative multipliers give a valid bound; these come close to the
optimum where the tangents do not (figures at ``LARGE_LP_POINTS``). That bound is valid but looser;
``FrontierPoint.exact_bound`` says which kind a point has.

**Local search** (:mod:`megatron_energy.optimisers.perseus.local_search`): fills of floats and trades between
neighbouring critical instructions, each judged exactly as above; it stops after ``TRADE_SWEEPS`` sweeps of
trades, when a round gains less than ``MIN_GAIN`` of the plan's energy or when the plan is within
``TARGET_GAP`` of the lower bound. The remaining gap
to the bound is reported with every point, as computed: never rounded down.

**Baseline.** Every instruction at its maximum clock (:func:`all_max_clocks`), as the GPU runs unplanned. On a
profile where a lower clock is faster (measurement noise), that is not the quickest plan; the sweep still
starts at the quickest one (``FrontierSolver.min_time_s``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import numpy as np
import scipy.sparse as sp

from megatron_energy.optimisers.perseus.frontier_points import (
    Frontier,
    FrontierPoint,
    PlanClocks,
    RelaxedSolution,
    interpolated,
)
from megatron_energy.optimisers.perseus.local_search import REL_TOL, TRADE_SWEEPS, LocalSearch, OptionTable
from megatron_energy.optimisers.perseus.longest_path import latest_starts, neighbour_pairs
from megatron_energy.optimisers.perseus.relaxation import HotStartProgram, lower_convex_hull
from megatron_energy.optimisers.perseus.starting_basis import tree_basis
from megatron_energy.pipeline.dag import PipelineDag
from megatron_energy.pipeline.instruction import Work
from megatron_energy.pipeline.profile import Profile
from megatron_energy.pipeline.stock_clocks import all_max_clocks
from megatron_energy.sim.simulator import Simulator, StagePowers

TARGET_GAP = 2e-4
"""The local search stops once a plan is within this fraction of the relaxed lower bound."""
MIN_GAIN = 1e-5
"""The local search stops when a round gains less than this fraction of the plan's energy."""
EXACT_LP_INSTRUCTIONS = 8192
"""Up to this many instructions, a sweep solves the relaxed problem at every deadline."""
LARGE_LP_POINTS = 8
"""Deadlines at which a sweep of a larger DAG solves the relaxed problem (the rest interpolate), spaced
quadratically from the fastest, where the optimum bends most. Measured on S=16 M=256 VPP=2 at every third
deadline between them, the bound is at most 0.049 % below the relaxed optimum (0.13 % with tangents alone;
0.14 % with the 12 evenly spaced solves and tangents used before). There the local search also only fills
floats: trades, each kept one shifting thousands of start times, cost more than they gain (0.002 % less
energy for 1.7 times the sweep time)."""


__all__ = [
    "Frontier",
    "FrontierPoint",
    "FrontierSolver",
    "PlanClocks",
    "RelaxedSolution",
    "interpolated",
]


class FrontierSolver:
    """Computes energy-minimal clock plans of one pipeline iteration for iteration-time deadlines.

    Args:
        dag: The iteration DAG.
        profile: Time and energy per clock of every instruction.
        powers: Blocked and idle power; the profile's when ``None`` (as in the simulator).

    Attributes:
        baseline: Simulation of every instruction at its maximum clock (:func:`all_max_clocks`).
        min_time_s: Iteration time with every instruction at its fastest option: no plan is quicker.
    """

    def __init__(self, dag: PipelineDag, profile: Profile, powers: StagePowers | None = None):
        self.dag = dag
        self.simulator = Simulator(dag, profile, powers)
        self._powers = (self.simulator.powers.blocked_power_w, self.simulator.powers.idle_power_w)
        self._tail_offset_j = np.array(self.simulator.tail_offsets_j())
        num_nodes = len(dag.nodes)
        self._preds: list[list[int]] = [[] for _ in dag.nodes]
        self._succs: list[list[int]] = [[] for _ in dag.nodes]
        edges = dag.edges_array()
        for u, v in edges.tolist():
            self._preds[v].append(u)
            self._succs[u].append(v)
        self._pred_pairs, self._succ_pairs = neighbour_pairs(self._preds), neighbour_pairs(self._succs)
        self._sink = dag.index["sink"]
        self._last = [dag.index[dag.stage_steps(stage)[-1]] for stage in range(dag.num_stages)]
        marginal_w = np.full(num_nodes, self._powers[0])
        marginal_w[self._last] = self._powers[1]
        self._compute: list[int] = dag.compute_indices().tolist()
        keys: dict[int, Work] = {}
        shared: dict[tuple[Work, float], OptionTable] = {}
        self._tables: list[OptionTable | None] = [None] * num_nodes
        for i in self._compute:
            keys[i] = dag.nodes[i].work
            table_key = (keys[i], float(marginal_w[i]))
            if table_key not in shared:
                shared[table_key] = OptionTable(profile.options(keys[i]), marginal_w[i])
            self._tables[i] = shared[table_key]
        hulls = {key: lower_convex_hull(profile.options(key)) for key in set(keys.values())}
        self._build_program(
            {i: hulls[key] for i, key in keys.items()}, marginal_w, self._bypassed(), self._last
        )
        fixed_s = dag.fixed_durations_s().tolist()
        chains = [[dag.index[node] for node in dag.stage_steps(stage)] for stage in range(dag.num_stages)]
        self._search = LocalSearch(
            self._preds, self._succs, self._tables, fixed_s, self._last, self._sink, self._powers, chains
        )
        self._positions = {dag.nodes[i]: position for position, i in enumerate(self._compute)}
        self._stage_of = np.array([dag.nodes[i].stage for i in self._compute], dtype=np.int64)
        self.baseline = self.simulator.run(all_max_clocks(dag, profile))
        self._search.load([0 if table else -1 for table in self._tables])
        self.min_time_s = self._search.makespan_s

    def _bypassed(self) -> tuple[np.ndarray, np.ndarray]:
        """The DAG's edges with chains of transfers bypassed, and the fixed time each edge carries.

        A transfer (a fixed node of one predecessor and one successor, of no cost) only relays
        ``τ_v ≥ τ_u + d_u + d_transfer``: the relaxed program keeps its optimum with one row per bypassed edge
        instead of two.
        """
        fixed_s = self.dag.fixed_durations_s().tolist()
        passing = [
            self._tables[v] is None and len(self._preds[v]) == 1 and len(self._succs[v]) == 1
            for v in range(len(self.dag.nodes))
        ]
        edges, carried = [], []
        for u, successors in enumerate(self._succs):
            if passing[u]:
                continue
            for v in successors:
                extra_s = 0.0
                while passing[v]:
                    extra_s += fixed_s[v]
                    v = self._succs[v][0]
                edges.append((u, v))
                carried.append(extra_s)
        return np.array(edges, dtype=np.int64).reshape(-1, 2), np.array(carried)

    def _build_program(
        self,
        hulls: Mapping[int, tuple[np.ndarray, np.ndarray]],
        marginal_w: np.ndarray,
        bypassed: tuple[np.ndarray, np.ndarray],
        last: list[int],
    ) -> None:
        """Assemble the relaxed program once (columns: ``τ`` per node, then ``δ`` per useful hull segment).

        A segment whose slope is not below the node's marginal power never pays off, so it is left out.
        """
        blocked_w, idle_w = self._powers
        num_nodes = len(self.dag.nodes)
        self._base_s = self.dag.fixed_durations_s()
        node_cost = np.zeros(num_nodes)
        node_cost[self._sink] = self.dag.num_stages * idle_w
        node_cost[last] += blocked_w - idle_w
        self._offset_j = self.simulator.tail_offset_j
        segment_node: list[int] = []
        segment_len: list[float] = []
        segment_cost: list[float] = []
        segment_count = np.zeros(num_nodes, dtype=np.int64)
        for i, (times, energies) in hulls.items():
            self._base_s[i] = times[0]
            self._offset_j += energies[0] - marginal_w[i] * times[0]
            costs = np.diff(energies) / np.diff(times) - marginal_w[i]
            useful = np.flatnonzero(costs < 0)  # slopes increase, so this is a prefix
            segment_count[i] = useful.size
            segment_node.extend([i] * useful.size)
            segment_len.extend(np.diff(times)[useful])
            segment_cost.extend(costs[useful])
        self._segment_node = np.asarray(segment_node, dtype=np.int64)
        edges, carried_s = bypassed
        sources, targets = edges[:, 0], edges[:, 1]
        counts = segment_count[sources]
        rows = np.repeat(np.arange(len(edges)), counts)
        first_segment = np.concatenate([[0], np.cumsum(segment_count)])[:-1]
        within = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
        columns = num_nodes + np.repeat(first_segment[sources], counts) + within
        num_columns = num_nodes + len(segment_node)
        matrix = sp.csc_matrix(
            (
                np.concatenate([np.ones(len(edges)), -np.ones(len(edges)), np.ones(rows.size)]),
                (
                    np.concatenate([np.arange(len(edges))] * 2 + [rows]),
                    np.concatenate([sources, targets, columns]),
                ),
            ),
            shape=(len(edges), num_columns),
        )
        upper = np.concatenate([np.full(num_nodes, np.inf), np.array(segment_len, dtype=np.float64)])
        upper[self.dag.index["source"]] = 0.0
        cost = np.concatenate([node_cost, np.array(segment_cost, dtype=np.float64)])
        rhs = -(self._base_s[sources] + carried_s)
        self._program = HotStartProgram(cost, matrix, rhs, np.zeros(num_columns), upper)
        self._program.set_basis(
            *tree_basis(edges, -rhs, node_cost, self._segment_node, cost[num_nodes:], upper[num_nodes:])
        )
        reaches_sink = np.zeros(num_columns, dtype=bool)
        reaches_sink[self._sink] = True
        for v in range(num_nodes - 1, -1, -1):
            reaches_sink[v] |= any(reaches_sink[w] for w in self._succs[v])
        self._reaches_sink = reaches_sink

    def relaxed(self, deadline_s: float) -> RelaxedSolution:
        """Solve the relaxed problem for one deadline (``math.inf`` for the minimum-energy point).

        Raises:
            ValueError: If the deadline is below the all-fastest iteration time.
        """
        if deadline_s < self.min_time_s * (1 - 1e-9):
            raise ValueError(
                f"deadline {deadline_s:.6g} s is below the fastest possible iteration time "
                f"{self.min_time_s:.6g} s"
            )
        self._program.set_upper(self._sink, deadline_s)
        solution, objective = self._program.solve()
        num_nodes = len(self.dag.nodes)
        durations = self._base_s + np.bincount(self._segment_node, solution[num_nodes:], minlength=num_nodes)
        lower_bound_j = float(objective + self._offset_j)
        slope = self._program.upper_bound_dual(self._sink) if math.isfinite(deadline_s) else 0.0
        multipliers = self._program.row_multipliers()
        return RelaxedSolution(
            deadline_s, float(solution[self._sink]), lower_bound_j, durations, slope, multipliers=multipliers
        )

    def dual_bound_j(self, multipliers: np.ndarray, deadline_s: float) -> float:
        """A lower bound on the energy of every plan that meets ``deadline_s``, from any row multipliers.

        The Lagrangian bound of the relaxed program
        (:meth:`~megatron_energy.optimisers.perseus.relaxation.HotStartProgram.dual_bound`): valid for every
        ``y ≥ 0``, the relaxed optimum for the optimal ones. No event of a node that precedes the sink is
        later than the deadline, which bounds those event times. Like :meth:`relaxed`, it sets the
        program's deadline to ``deadline_s``.
        """
        self._program.set_upper(self._sink, deadline_s)
        implied = np.where(self._reaches_sink, deadline_s, math.inf)
        return self._program.dual_bound(multipliers, implied) + self._offset_j

    def _durations(self, choice: list[int]) -> list[float]:
        """Durations by node index of an option choice."""
        durations = self._base_s.tolist()
        for i in self._compute:
            durations[i] = self._tables[i].times_s[choice[i]]  # type: ignore[union-attr]
        return durations

    def _rounded(self, relaxed: RelaxedSolution) -> tuple[list[int], list[float]]:
        """Round the relaxed durations to options; the choice and the earliest starts of the rounded plan.

        In topological order, each compute node takes the option of least marginal cost that ends by the
        latest end the relaxed schedule allows its successors.

        Returns:
            The option index per compute node (-1 for other nodes) and the start of every node.
        """
        relaxed_s = relaxed.durations_s.tolist()
        latest = latest_starts(
            self._succs, self._succ_pairs, relaxed_s, min(relaxed.deadline_s, relaxed.time_s)
        )
        durations = list(self._search.fixed_s)  # compute nodes get their option's below
        choice = [-1] * len(durations)
        end = [0.0] * len(durations)
        starts = [0.0] * len(durations)
        for v, pair in enumerate(self._pred_pairs):
            if pair is not None:
                first, second = end[pair[0]], end[pair[1]]
                start = first if first > second else second
            else:
                start = max([end[u] for u in self._preds[v]]) if self._preds[v] else 0.0
            table = self._tables[v]
            if table is not None:
                choice[v] = table.choose(
                    latest[v] + relaxed_s[v] - start
                )  # the latest end its successors allow
                durations[v] = table.times_s[choice[v]]
            starts[v] = start
            end[v] = start + durations[v]
        return choice, starts

    def _tighten(self, choice: list[int], deadline_s: float) -> list[int]:
        """Move nodes without slack for ``deadline_s`` to their fastest option until it is met.

        Only relaxed solutions that violate their constraints by the solver's tolerance need this.
        """
        while True:
            durations = np.asarray(self._durations(choice))
            schedule = self.dag.schedule_array(durations)
            if schedule.makespan_s <= deadline_s * (1 + REL_TOL):
                return choice
            slack = self.dag.latest_start_s(durations, deadline_s) - schedule.start_s
            late = [i for i in self._compute if slack[i] < 0 and choice[i] != 0]
            if not late:
                raise ValueError(f"deadline {deadline_s:.9g} s cannot be met even at the fastest clocks")
            for i in late:
                choice[i] = 0

    def with_exact_bound(self, point: FrontierPoint) -> FrontierPoint:
        """``point`` with the relaxed optimum at its deadline as its bound (solved here if it had a dual one).

        A sweep of a large DAG gives most points a dual bound (see :class:`FrontierPoint`); a point that is
        handed out as a plan gets the exact bound, so the gap printed with it is the gap to the optimum.
        """
        if point.exact_bound:
            return point
        bound_j = self.relaxed(point.deadline_s).lower_bound_j
        return dataclasses.replace(point, lower_bound_j=bound_j, exact_bound=True)

    def solve(self, deadline_s: float) -> FrontierPoint:
        """The plan for one deadline (``math.inf``: the minimum-energy plan), simulated.

        Raises:
            ValueError: If the deadline is below the all-fastest iteration time.
        """
        return self._plan(self.relaxed(deadline_s))

    def _plan(self, relaxed: RelaxedSolution) -> FrontierPoint:
        """Round ``relaxed`` to options, improve the plan by local search, and return it as a point."""
        deadline_s = relaxed.deadline_s
        search = self._search
        choice, starts = self._rounded(relaxed)
        energy_j = search.load(choice, starts)
        if search.makespan_s > deadline_s * (1 + REL_TOL):
            energy_j = search.load(self._tighten(choice, deadline_s))
        reference_j = relaxed.lower_bound_j if relaxed.chord_j is None else relaxed.chord_j
        target_j = reference_j * (1 + TARGET_GAP)
        tail_j = self.simulator.tail_offset_j  # the search's energy leaves out the tail's constant
        if energy_j + tail_j > target_j:
            sweeps = TRADE_SWEEPS if len(self._compute) <= EXACT_LP_INSTRUCTIONS else 0
            search.improve(deadline_s, MIN_GAIN * (energy_j + tail_j), target_j - tail_j, sweeps)
        return self._point(deadline_s, relaxed.lower_bound_j, relaxed.exact)

    def _point(self, deadline_s: float, lower_bound_j: float, exact_bound: bool) -> FrontierPoint:
        """The search's current plan as a frontier point (figures as the simulator accounts them)."""
        search, compute, tables = self._search, self._compute, self._tables
        choice, durations, start = search.choice, search.durations, search.start
        options = [tables[i].options[choice[i]] for i in compute]  # type: ignore[union-attr]
        stages = self.dag.num_stages
        busy_s = np.bincount(self._stage_of, [durations[i] for i in compute], minlength=stages)
        busy_j = np.bincount(self._stage_of, [option.energy_j for option in options], minlength=stages)
        iteration_s = start[self._sink]
        last_end_s = np.array([start[i] + durations[i] for i in self._last])
        blocked_w, idle_w = self._powers
        stage_j = busy_j + blocked_w * (last_end_s - busy_s) + idle_w * (iteration_s - last_end_s)
        stage_j += self._tail_offset_j  # a measured tail: its energy instead of idle power over it
        return FrontierPoint(
            deadline_s=deadline_s,
            time_s=iteration_s,
            energy_j=float(stage_j.sum()),
            lower_bound_j=lower_bound_j,
            stage_energy_j=tuple(stage_j.tolist()),
            stage_busy_s=tuple(busy_s.tolist()),
            clocks=PlanClocks(self._positions, [option.clock_mhz for option in options]),
            exact_bound=exact_bound,
        )

    def sweep(
        self, num_points: int = 100, max_time_s: float | None = None, lp_points: int | None = None
    ) -> Frontier:
        """The frontier for ``num_points`` deadlines evenly spaced from the all-fastest time.

        Deadlines are solved from the largest down, so each LP restarts from a nearby basis. A plan found for
        one deadline also meets every larger one, so each point holds the best plan found within its deadline.

        Args:
            num_points: Number of deadlines (at least 2).
            max_time_s: Largest deadline; default the time of the relaxed minimum-energy point.
            lp_points: At how many of the deadlines (both ends included, spaced quadratically from the
                fastest) to solve the relaxed problem; the others round an interpolated relaxed solution and
                get a dual bound (see :class:`FrontierPoint`). Default: all of them on a DAG of at most
                ``EXACT_LP_INSTRUCTIONS`` instructions, ``LARGE_LP_POINTS`` on a larger one (where the LP
                dominates the sweep).

        Returns:
            The frontier; each point holds the least-energy plan found whose time is within its deadline.
        """
        if num_points < 2:
            raise ValueError(f"num_points must be at least 2, got {num_points}")
        if lp_points is None:
            lp_points = num_points if len(self._compute) <= EXACT_LP_INSTRUCTIONS else LARGE_LP_POINTS
        if max_time_s is None:
            max_time_s = max(self.relaxed(math.inf).time_s, self.min_time_s)
        deadlines = np.linspace(self.min_time_s, max_time_s, num_points).tolist()
        if lp_points >= num_points:
            exact_at = list(range(num_points))
        else:
            spread = max(lp_points, 2) - 1
            exact_at = sorted({round((k / spread) ** 2 * (num_points - 1)) for k in range(spread + 1)})
        solved = {k: self.relaxed(deadlines[k]) for k in exact_at[::-1]}
        relaxed = []
        for k, deadline in enumerate(deadlines):
            if k in solved:
                relaxed.append(solved[k])
                continue
            low = max(at for at in exact_at if at < k)
            high = min(at for at in exact_at if at > k)
            between = interpolated(solved[low], solved[high], deadline)
            bound_j = max(solution.tangent_j(deadline) for solution in solved.values())
            if between.multipliers is not None:
                bound_j = max(bound_j, self.dual_bound_j(between.multipliers, deadline))
            relaxed.append(dataclasses.replace(between, lower_bound_j=bound_j))
        plans = [self._plan(solution) for solution in relaxed]
        points = []
        for point in plans:
            best = min(
                (other for other in plans if other.time_s <= point.deadline_s * (1 + REL_TOL)),
                key=lambda other: (other.energy_j, other.time_s),
            )
            points.append(
                dataclasses.replace(
                    best,
                    deadline_s=point.deadline_s,
                    lower_bound_j=point.lower_bound_j,
                    exact_bound=point.exact_bound,
                )
            )
        return Frontier(tuple(points), self.baseline, self.min_time_s)
