"""Benchmark our time–energy frontier against lowtime's Phillips–Dessouky solver on families of profiles.

Profiles come from `lab/profile_family.py`, one per seed and family: ``imbalanced``
(issue 13's family: stages ±25 % apart, per-instruction clock sensitivity and power drawn at random, the A100
grid 1410→900 MHz in 30 MHz steps, 85 W blocked and idle power) and ``balanced`` (the same, but stages within
±2.5 % and a heavier first and last stage: ``balanced_family``). Both solvers get the SAME pipeline DAG
(megatron-core's 1F1B order, pipeline transfers as fixed-duration nodes timed over the A100 spec's P2P link)
and the SAME profile, under the same energy accounting: with blocked power = idle power, lowtime's cost
(energy − p2p power · time, p2p power = the blocked power) is exactly our objective.

lowtime is run as zeus' ``examples/pipeline_frequency_optimizer/run_optimization.py`` drives it: 1 ms unit
time, Pareto filtering (0.95 noise factor when three or fewer options survive), ``ExponentialModel(
search_strategy="best")``, ``PhillipsDessouky(dag).run()``, one plan per iteration. Its time covers fitting,
building its DAG and all iterations. It takes minutes per profile, so ``--lowtime-cache DIR`` keeps its plans
and times on disk, keyed by the profile, DAG and lowtime version; a cached time was measured by an earlier
run of this script (same machine, same pinning, but not the same moment; entries written before CPU times
were kept have a wall time only, and no CPU ratio).

Ours: ``FrontierSolver(dag, profile).sweep(100)``, timed from construction to the last point (the relaxed
minimum-energy solve, 100 deadlines, rounding, local search and the figures of every point included).

Both are timed in wall-clock seconds and in CPU seconds of the process. On a shared machine the wall time
depends on what else ran on the core at that moment, so the ratios that the acceptance checks use are CPU
time ratios (each process pinned to one core: the time it had that core); wall ratios are printed beside them.

Every plan of both solvers is evaluated in OUR simulator (modelled). Per seed it prints the speed ratio; the
energy difference at matched times: at each of our deadlines, our point vs. the best lowtime plan within it,
and at up to 100 lowtime plans' times, our plan for that time as ``Planner.point_for_time`` picks it vs. that
plan; and whether the iso-time plan (our plan for the all-maximum-clocks time) is no slower than all-maximum
clocks. Then the median and worst ratio over seeds, per family, and, unless ``--skip-large``, our time on
S=16 M=256 VPP=2.

Run it pinned to one core, e.g.::

    taskset -c 1 .venv/bin/python lab/bench_frontier.py --seeds 5 --lowtime-cache .bench-cache
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import os
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import networkx as nx
import numpy as np
from lowtime import __version__ as lowtime_version
from lowtime.cost_model import CostModel, ExponentialModel
from lowtime.graph_utils import add_sink_node, add_source_node
from lowtime.operation import CandidateExecutionOptions, ExecutionOption, Operation, OperationSpec
from lowtime.perseus.instruction import Backward, Forward
from lowtime.solver import PhillipsDessouky
from profile_family import ProfileFamily, balanced_family, family_profile

from megatron_energy.dvfs.spec import load_gpu_spec
from megatron_energy.optimisers.perseus.frontier import Frontier, FrontierPoint, FrontierSolver
from megatron_energy.pipeline.dag import PipelineDag
from megatron_energy.pipeline.dag_nodes import CommSpec, NodeId
from megatron_energy.pipeline.profile import Profile, TransformerShape
from megatron_energy.pipeline.profile_csv import profile_csv_text
from megatron_energy.pipeline.schedule_orders import pipeline_orders
from megatron_energy.sim.simulator import Simulator

GPU = "a100-sxm-80gb"
UNIT_TIME_S = 0.001
NOISE_FACTOR = 0.95
NUM_DEADLINES = 100
ENERGY_TOLERANCE = 0.001
LOWTIME_MATCHES = 100
MEDIAN_RATIO, WORST_RATIO, LARGE_LIMIT_S = 50.0, 20.0, 10.0
MAIN_CASE = (8, 64, 1)
QUICK_CASE = (4, 16, 1)
LARGE_CASE = (16, 256, 2)
CACHE_LAYOUT = 1
"""Bump when the lowtime adapter below changes what it computes."""
FAMILIES: dict[str, Callable[[int, int, float], ProfileFamily]] = {
    "imbalanced": lambda stages, chunks, noise: ProfileFamily(stages, chunks, noise=noise),
    "balanced": balanced_family,
}
"""The profile families, by name: each builds its family from the stages, chunks and noise."""


@dataclass
class Case:
    """One benchmark input: the DAG, a family profile and the simulator that judges both solvers."""

    stages: int
    microbatches: int
    chunks: int
    seed: int
    family: str
    dag: PipelineDag
    profile: Profile
    simulator: Simulator

    @property
    def label(self) -> str:
        """Human-readable case name."""
        vpp = f" VPP={self.chunks}" if self.chunks > 1 else ""
        return f"S={self.stages} M={self.microbatches}{vpp} {self.family} seed {self.seed}"


def build_case(
    stages: int, microbatches: int, chunks: int, seed: int, noise: float, family: str = "imbalanced"
) -> Case:
    """The profile of ``seed`` in ``family`` on the 1F1B DAG, transfers of GPT-3 1.3B activations (mbs 4)."""
    spec = load_gpu_spec(GPU)
    profile = family_profile(FAMILIES[family](stages, chunks, noise), seed)
    shape = TransformerShape.from_name("gpt3-1.3b", micro_batch_size=4)
    comm = CommSpec(spec.p2p_latency_s, spec.p2p_bandwidth_gbps, shape.activation_bytes())
    dag = PipelineDag.build(pipeline_orders(stages, microbatches, chunks), comm=comm)
    return Case(stages, microbatches, chunks, seed, family, dag, profile, Simulator(dag, profile))


class ConstantCost(CostModel):
    """lowtime cost model of a fixed-duration node (a pipeline transfer): its cost never changes."""

    def __call__(self, quant_time: int) -> float:
        """The constant cost (zero: a transfer's energy is the same under every plan)."""
        return 0.0


def lowtime_dag(case: Case) -> tuple[nx.DiGraph, dict[NodeId, Operation]]:
    """The activity-on-node DAG for lowtime: a node per node of ours, specs built as Perseus builds them."""
    p2p_power_w = case.profile.blocked_power_w
    specs: dict[object, OperationSpec] = {}
    for key in case.profile:
        options = [
            ExecutionOption[int](real_time=o.time_s, unit_time=UNIT_TIME_S, cost=o.energy_j, knob=o.clock_mhz)
            for o in case.profile.options(key)
        ]
        for option in options:
            option.cost -= p2p_power_w * option.quant_time * option.unit_time
        candidates = CandidateExecutionOptions[int](options=options)
        if len(candidates.options) <= 3:
            candidates = CandidateExecutionOptions[int](options=options, noise_factor=NOISE_FACTOR)
        model = ExponentialModel(candidates, search_strategy="best")
        specs[key] = OperationSpec[int](options=candidates, cost_model=model)
    graph = nx.DiGraph()
    operations: dict[NodeId, Operation] = {}
    ids = {node: i for i, node in enumerate(case.dag.nodes)}
    for node in case.dag.nodes:
        attrs = case.dag.graph.nodes[node]
        if attrs["type"] == "compute":
            kind = Forward if attrs["kind"] == "forward" else Backward
            spec = specs[attrs["work"]]
            operations[node] = kind(spec=spec, stage_id=attrs["stage"], micro_batch_id=attrs["microbatch"])
            graph.add_node(ids[node], op=operations[node])
        elif attrs["type"] in ("comm", "tail"):
            fixed = ExecutionOption[int](
                real_time=attrs["duration_s"], unit_time=UNIT_TIME_S, cost=0.0, knob=0
            )
            spec = OperationSpec(
                options=CandidateExecutionOptions[int](options=[fixed]), cost_model=ConstantCost()
            )
            graph.add_node(ids[node], op=Operation(spec=spec))
    graph.add_edges_from((ids[u], ids[v]) for u, v in case.dag.graph.edges if u != "source" and v != "sink")
    add_source_node(graph, ids["source"])
    add_sink_node(graph, ids["sink"])
    graph.graph["source_node"], graph.graph["sink_node"] = ids["source"], ids["sink"]
    return graph, operations


@dataclass(frozen=True)
class Timing:
    """How long a solver took: wall-clock seconds and CPU seconds of this process (all its threads)."""

    wall_s: float
    cpu_s: float


class Stopwatch:
    """Measures wall and process CPU time from its creation."""

    def __init__(self) -> None:
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def read(self) -> Timing:
        """The time since creation."""
        return Timing(time.perf_counter() - self._wall, time.process_time() - self._cpu)


def run_lowtime(case: Case) -> tuple[np.ndarray, Timing]:
    """All lowtime plans (clock per compute node, one row per iteration) and the time to produce them."""
    watch = Stopwatch()
    with warnings.catch_warnings():  # its grid search of initial guesses warns about the fits it rejects
        warnings.simplefilter("ignore")
        graph, operations = lowtime_dag(case)
    nodes = case.dag.compute_nodes()
    plans = [[int(operations[node].assigned_knob) for node in nodes] for _ in PhillipsDessouky(graph).run()]
    return np.asarray(plans, dtype=np.int32), watch.read()


def profile_rows_text(profile: Profile) -> str:
    """The profile's rows as CSV text without its provenance column: what lowtime's result depends on."""
    return profile_csv_text(profile.csv_rows(), with_chunk=profile.num_chunks > 1, with_source=False)


def cache_key(case: Case) -> str:
    """What lowtime's result depends on: the profile's rows, the DAG, lowtime's version and this adapter."""
    digest = hashlib.sha256()
    digest.update(profile_rows_text(case.profile).encode())
    edges = case.dag.edges_array()
    digest.update(edges.tobytes())
    digest.update(case.dag.fixed_durations_s().tobytes())
    digest.update(
        json.dumps([repr(node) for node in case.dag.nodes], separators=(",", ":")).encode()
        + f"{lowtime_version}|{UNIT_TIME_S}|{NOISE_FACTOR}|".encode()
        + f"{case.profile.blocked_power_w}|{CACHE_LAYOUT}".encode()
    )
    return digest.hexdigest()[:24]


def lowtime_result(case: Case, cache_dir: Path | None) -> tuple[np.ndarray, Timing, bool]:
    """The plans and time of lowtime, from ``cache_dir`` when it holds them; True if they were cached."""
    path = cache_dir / f"lowtime-{cache_key(case)}.npz" if cache_dir is not None else None
    if path is not None and path.exists():
        with np.load(path) as data:
            cpu_s = float(data["cpu_s"]) if "cpu_s" in data else math.nan
            return data["plans"], Timing(float(data["wall_s"]), cpu_s), True
    plans, timing = run_lowtime(case)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{os.getpid()}.tmp.npz")
        np.savez_compressed(
            temporary, plans=plans, wall_s=timing.wall_s, cpu_s=timing.cpu_s, load=os.getloadavg()[0]
        )
        temporary.replace(path)
    return plans, timing, False


def run_ours(case: Case) -> tuple[Frontier, FrontierSolver, Timing]:
    """Our frontier of ``NUM_DEADLINES`` points, its solver, and its time (construction included)."""
    watch = Stopwatch()
    solver = FrontierSolver(case.dag, case.profile)
    frontier = solver.sweep(NUM_DEADLINES)
    return frontier, solver, watch.read()


@dataclass
class SeedResult:
    """One seed's figures."""

    lowtime: Timing
    ours: Timing
    cached: bool
    worst_excess: float
    median_excess: float
    matched: int
    iso_time_s: float
    all_max_s: float
    iso_saving: float
    worst_gap: float

    @property
    def ratio(self) -> float:
        """The CPU time of lowtime over ours: the time each had its one core (NaN without lowtime's)."""
        return self.lowtime.cpu_s / self.ours.cpu_s

    @property
    def wall_ratio(self) -> float:
        """The wall time of lowtime over ours (inflated by whatever else ran on the core at the time)."""
        return self.lowtime.wall_s / self.ours.wall_s


def compare(frontier: Frontier, solver: FrontierSolver, lowtime: list[tuple[float, float]]) -> list[float]:
    """Relative energy excess of ours over lowtime at matched iteration times, both ways.

    At each of our deadlines: our point vs. the least-energy lowtime plan within it. At (up to
    ``LOWTIME_MATCHES`` evenly spread) lowtime plans' times ``T`` within our range: our plan for ``T`` as the
    planner gives it to a straggler (``Planner.point_for_time``: a solve at ``T`` or a frontier point within
    ``T``, whichever uses less) vs. that lowtime plan.
    """
    excesses = []
    for point in frontier.points:
        within = [energy for t, energy in lowtime if t <= point.deadline_s * (1 + 1e-12)]
        if within:
            excesses.append(point.energy_j / min(within) - 1)
    in_range = [(t, e) for t, e in lowtime if frontier.min_time_s <= t <= frontier.points[-1].deadline_s]
    step = max(1, len(in_range) // LOWTIME_MATCHES)
    for time_s, energy_j in in_range[::step]:
        excesses.append(plan_for_time(frontier, solver, time_s).energy_j / energy_j - 1)
    return excesses


def plan_for_time(frontier: Frontier, solver: FrontierSolver, time_s: float) -> FrontierPoint:
    """Our plan for an iteration time, as ``Planner.point_for_time`` picks it (without switch latency)."""
    listed = frontier.best_within(time_s)
    solved = solver.solve(max(time_s, solver.min_time_s))
    return solved if listed is None or solved.energy_j <= listed.energy_j else listed


def bench_seed(case: Case, cache_dir: Path | None) -> SeedResult:
    """Run both solvers on one case and print its line."""
    plans, lowtime_time, cached = lowtime_result(case, cache_dir)
    frontier, solver, ours_time = run_ours(case)
    nodes = case.dag.compute_nodes()
    lowtime = [case.simulator.evaluate(dict(zip(nodes, row.tolist(), strict=True))) for row in plans]
    excesses = compare(frontier, solver, lowtime)
    baseline = frontier.baseline
    iso = plan_for_time(frontier, solver, baseline.iteration_time_s)
    result = SeedResult(
        lowtime=lowtime_time,
        ours=ours_time,
        cached=cached,
        worst_excess=max(excesses),
        median_excess=statistics.median(excesses),
        matched=len(excesses),
        iso_time_s=iso.time_s,
        all_max_s=baseline.iteration_time_s,
        iso_saving=1 - iso.energy_j / baseline.total_energy_j,
        worst_gap=max(point.gap for point in frontier.points),
    )
    print(
        f"{case.seed:>4} {len(plans):>6} {lowtime_time.cpu_s:>7.1f}{'*' if cached else ' '} "
        f"{lowtime_time.wall_s:>7.1f} {ours_time.cpu_s:>6.2f} {ours_time.wall_s:>6.2f} {result.ratio:>6.1f} "
        f"{result.wall_ratio:>6.1f} {100 * result.worst_excess:>+9.3f} {100 * result.median_excess:>+9.3f} "
        f"{result.matched:>6} {iso.time_s:>9.5f} {baseline.iteration_time_s:>9.5f} "
        f"{100 * result.iso_saving:>6.2f} {100 * result.worst_gap:>7.3f}",
        flush=True,
    )
    return result


def gap_summary(frontier: Frontier) -> str:
    """The worst gap to the lower bound, separately where it is the relaxed optimum and where a dual bound."""
    parts = []
    for exact, name in ((True, "relaxed optimum"), (False, "dual bound, looser")):
        gaps = [point.gap for point in frontier.points if point.exact_bound == exact]
        if gaps:
            parts.append(f"{100 * max(gaps):.3f} % at {len(gaps)} deadlines ({name})")
    return "worst gap to the lower bound " + "; ".join(parts)


def bench_large(noise: float) -> tuple[Timing, bool]:
    """Time ours on the large case; return the time and whether its iso-time plan keeps the all-max time."""
    case = build_case(*LARGE_CASE, seed=0, noise=noise)
    frontier, _, elapsed = run_ours(case)
    iso = frontier.best_within(frontier.baseline.iteration_time_s)
    print(
        f"\n{case.label} (ours alone, {len(case.dag.nodes)} nodes, {len(case.dag.compute_nodes())} "
        f"instructions): {len(frontier.points)} deadlines in {elapsed.cpu_s:.1f} s CPU "
        f"({elapsed.wall_s:.1f} s wall); {gap_summary(frontier)}"
    )
    if iso is not None:
        print(
            f"iso-time {iso.time_s:.4f} s / {iso.energy_j:,.0f} J vs all-max "
            f"{frontier.baseline.iteration_time_s:.4f} s / {frontier.baseline.total_energy_j:,.0f} J "
            "(modelled)"
        )
    return elapsed, iso is not None and iso.time_s <= frontier.baseline.iteration_time_s


def bench_family(family: str, shape: tuple[int, int, int], args: argparse.Namespace) -> list[SeedResult]:
    """Run both solvers on ``args.seeds`` profiles of ``family``; print a line per seed and the ratios."""
    stages, microbatches, _ = shape
    print(f"\n{family} family, S={stages} M={microbatches}")
    print(
        "seed  plans  lowtime CPU/wall s  ours CPU/wall s  ratio CPU/wall  worst ΔE%  median ΔE%  match  "
        "iso-time s  all-max s  save%   gap%"
    )
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    cases = (build_case(*shape, seed, args.noise, family) for seed in seeds)
    results = [bench_seed(case, args.lowtime_cache) for case in cases]
    ratios = [result.ratio for result in results if math.isfinite(result.ratio)] or [math.nan]
    wall_ratios = [result.wall_ratio for result in results]
    print(
        f"{family}: speed ratio (CPU time, {len(results)} seeds): median {statistics.median(ratios):.1f}x, "
        f"worst {min(ratios):.1f}x; (wall time): median {statistics.median(wall_ratios):.1f}x, worst "
        f"{min(wall_ratios):.1f}x; worst ΔE {100 * max(r.worst_excess for r in results):+.3f} %"
    )
    return results


def family_checks(family: str, results: list[SeedResult]) -> dict[str, bool]:
    """The acceptance checks of one family's results."""
    ratios = [result.ratio for result in results if math.isfinite(result.ratio)] or [math.nan]
    return {
        f"{family}: median ratio >= {MEDIAN_RATIO:g}x": statistics.median(ratios) >= MEDIAN_RATIO,
        f"{family}: worst ratio >= {WORST_RATIO:g}x": min(ratios) >= WORST_RATIO,
        f"{family}: energy <= lowtime + {100 * ENERGY_TOLERANCE:g} % at every matched time": all(
            result.worst_excess <= ENERGY_TOLERANCE for result in results
        ),
        f"{family}: iso-time plans no slower than all-max": all(r.iso_time_s <= r.all_max_s for r in results),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=5, help="profiles of each family (seeds 0..N-1)")
    parser.add_argument("--first-seed", type=int, default=0, help="start there (to share seeds among runs)")
    parser.add_argument("--quick", action="store_true", help="the small case S=4 M=16 instead of S=8 M=64")
    parser.add_argument(
        "--microbatches", type=int, help="microbatches instead of the case's (64, or 16 quick)"
    )
    parser.add_argument(
        "--family",
        choices=sorted(FAMILIES),
        action="append",
        help="a family (repeatable; default all)",
    )
    parser.add_argument("--skip-large", action="store_true", help="skip timing S=16 M=256 VPP=2")
    parser.add_argument("--lowtime-cache", type=Path, help="folder that keeps lowtime's results")
    parser.add_argument("--noise", type=float, default=0.0, help="the families' relative profile noise")
    args = parser.parse_args()
    logging.getLogger("lowtime").setLevel(logging.WARNING)
    stages, microbatches, chunks = QUICK_CASE if args.quick else MAIN_CASE
    shape = (stages, args.microbatches or microbatches, chunks)
    print(
        f"profiles (modelled): S={shape[0]} M={shape[1]}, clocks 1410-900 MHz step 30, "
        f"blocked = idle = 85 W, noise {args.noise:g}; lowtime unit time {1e3 * UNIT_TIME_S:g} ms; "
        f"ours {NUM_DEADLINES} deadlines; CPU affinity {sorted(os.sched_getaffinity(0))}, "
        f"load {os.getloadavg()[0]:.1f}"
    )
    checks: dict[str, bool] = {}
    for family in args.family or FAMILIES:
        checks |= family_checks(family, bench_family(family, shape, args))
    print(
        "(* lowtime's times from the cache: measured by an earlier run on this machine; CPU = the process's "
        "CPU time on its one core; ΔE = ours / lowtime − 1 at matched times, modelled)"
    )
    if not args.skip_large and not args.quick:
        elapsed, iso_ok = bench_large(args.noise)
        checks[f"S=16 M=256 VPP=2 in <= {LARGE_LIMIT_S:g} s (CPU time)"] = elapsed.cpu_s <= LARGE_LIMIT_S
        checks["S=16 M=256 VPP=2 iso-time no slower than all-max"] = iso_ok
    print("\nacceptance:")
    for name, passed in checks.items():
        print(f"  {name}: {'yes' if passed else 'NO'}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
