"""Benchmark our time–energy frontier against lowtime's Phillips–Dessouky solver, as Perseus drives it.

Both solvers get the SAME pipeline DAG (Megatron's 1F1B order, pipeline transfers as fixed-duration nodes)
and the SAME *modelled* profile: GPT-3 1.3B (mbs 4, seq 2048) on the ``a100-sxm-80gb`` spec, every stage's
forward and backward priced by the time/power model. The clock grid is restricted to 1410→900 MHz in 15 MHz
steps (35 clocks, the range Kareus sweeps on A100): with the full 1410→210 MHz grid lowtime would need
~(T_max − T_min)/1 ms ≈ 10⁴ iterations per case, hours at S=8 M=64.

lowtime is run exactly as zeus' ``examples/pipeline_frequency_optimizer/run_optimization.py`` does: 1 ms unit
time, cost = energy − p2p_power·quantised time with p2p_power = the spec's blocked power, Pareto filtering
with the 0.95 noise factor when three or fewer options survive, ``ExponentialModel(search_strategy="best")``,
``PhillipsDessouky(dag).run()``, the clocks copied at every iteration (one plan per iteration). Transfer nodes
become lowtime operations with one option and a constant cost.

Every plan of both solvers is evaluated in OUR simulator (modelled). Two comparisons per case:

* at each of our deadlines: our plan's energy vs. the least energy of any lowtime plan whose simulated
  iteration time is within that deadline;
* at each lowtime plan's simulated iteration time T: its energy vs. our planner's plan for T
  (``Planner.point_for_time``, as used for stragglers: a solve at deadline T or a frontier point within T).

Wall times are measured on this machine (median of ``--repeats`` runs for ours; lowtime once for the two large
cases, median of ``--repeats`` for the small one). Ours includes building the program, all solves, rounding
and simulating each point; lowtime's includes fitting its cost models, building its DAG and all iterations.

Usage: ``.venv/bin/python scripts/bench_frontier.py [--quick] [--repeats 3]``
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
import warnings
from dataclasses import dataclass

import networkx as nx
import numpy as np
from lowtime.cost_model import CostModel, ExponentialModel
from lowtime.graph_utils import add_sink_node, add_source_node
from lowtime.operation import CandidateExecutionOptions, ExecutionOption, Operation, OperationSpec
from lowtime.perseus.instruction import Backward, Forward
from lowtime.solver import PhillipsDessouky

from megatron_energy.dvfs.spec import load_gpu_spec
from megatron_energy.megatron.schedule import pipeline_orders
from megatron_energy.perseus.frontier import Frontier, FrontierSolver
from megatron_energy.perseus.planner import Planner
from megatron_energy.pipeline.dag import CommSpec, NodeId, PipelineDag
from megatron_energy.pipeline.profile import Profile, TransformerShape
from megatron_energy.sim.simulator import Simulator

GPU = "a100-sxm-80gb"
MIN_CLOCK_MHZ = 900
MICRO_BATCH = 4
UNIT_TIME_S = 0.001
NOISE_FACTOR = 0.95
NUM_DEADLINES = 100
TOLERANCE = 0.001
SPEEDUP_CASE = (8, 64, 1)
CASES = ((4, 16, 1), (8, 32, 1), (8, 64, 1))
OURS_ONLY = ((16, 256, 2),)


@dataclass
class Case:
    """One benchmark setting: the DAG, the profile and the simulator that judges both solvers."""

    stages: int
    microbatches: int
    chunks: int
    dag: PipelineDag
    profile: Profile
    simulator: Simulator

    @property
    def label(self) -> str:
        """Human-readable case name."""
        vpp = f" VPP={self.chunks}" if self.chunks > 1 else ""
        return f"S={self.stages} M={self.microbatches}{vpp}"


def build_case(stages: int, microbatches: int, chunks: int) -> Case:
    spec = load_gpu_spec(GPU)
    # 24 layers do not split over 16 stages x 2 chunks; the large case uses 32 layers of the same width.
    layers = 24 if 24 % (stages * chunks) == 0 else 32
    shape = TransformerShape.from_name("gpt3-1.3b", micro_batch_size=MICRO_BATCH, num_layers=layers)
    clocks = [clock for clock in spec.sm_clocks_mhz if clock >= MIN_CLOCK_MHZ]
    profile = Profile.synthetic(shape, spec, stages, chunks, clocks_mhz=clocks)
    comm = CommSpec(spec.p2p_latency_s, spec.p2p_bandwidth_gbps, shape.activation_bytes())
    dag = PipelineDag.build(pipeline_orders(stages, microbatches, chunks), comm=comm)
    return Case(stages, microbatches, chunks, dag, profile, Simulator(dag, profile))


class ConstantCost(CostModel):
    """lowtime cost model of a fixed-duration node (a pipeline transfer): its cost never changes."""

    def __call__(self, quant_time: int) -> float:
        """The constant cost (zero: a transfer's energy is the same under every plan)."""
        return 0.0


def lowtime_dag(case: Case) -> tuple[nx.DiGraph, dict[NodeId, Operation]]:
    """The activity-on-node DAG for lowtime: a node per node of ours, specs built as Perseus builds them."""
    p2p_power_w = case.profile.blocked_power_w
    specs: dict[tuple[int, str, int], OperationSpec] = {}
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
            spec = specs[(attrs["stage"], attrs["kind"], attrs["chunk"])]
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
    graph.add_edges_from(
        (ids[u], ids[v]) for u, v in case.dag.graph.edges if u not in ("source",) and v not in ("sink",)
    )
    add_source_node(graph, ids["source"])
    add_sink_node(graph, ids["sink"])
    graph.graph["source_node"], graph.graph["sink_node"] = ids["source"], ids["sink"]
    return graph, operations


def run_lowtime(case: Case) -> tuple[list[dict[NodeId, int]], float]:
    """All lowtime plans (one per Phillips–Dessouky iteration) and the wall time to produce them."""
    start = time.perf_counter()
    with warnings.catch_warnings():  # its grid search of initial guesses warns about the fits it rejects
        warnings.simplefilter("ignore")
        graph, operations = lowtime_dag(case)
    plans = []
    for _ in PhillipsDessouky(graph).run():
        plans.append({node: int(op.assigned_knob) for node, op in operations.items()})
    return plans, time.perf_counter() - start


def run_ours(case: Case, max_time_s: float) -> tuple[Frontier, float]:
    start = time.perf_counter()
    frontier = FrontierSolver(case.dag, case.profile).sweep(NUM_DEADLINES, max_time_s=max_time_s)
    return frontier, time.perf_counter() - start


def compare(case: Case, frontier: Frontier, lowtime: list[tuple[float, float]]) -> tuple[float, float]:
    """Print both comparisons; return the worst relative excess of ours over lowtime in each."""
    print(f"\n{case.label}: energy per iteration at matched iteration times (modelled, our simulator)")
    header = ("deadline s", "ours s", "ours J", "lowtime s", "lowtime J", "ours-lt %")
    print(" ".join(f"{name:>{width}}" for name, width in zip(header, (11, 9, 11, 10, 11, 9), strict=True)))
    worst_at_ours = -np.inf
    for point in frontier.points:
        within = [(e, t) for t, e in lowtime if t <= point.deadline_s * (1 + 1e-12)]
        if not within:
            print(f"{point.deadline_s:11.5f} {point.time_s:9.5f} {point.energy_j:11.2f} {'(none)':>10}")
            continue
        energy_lt, time_lt = min(within)
        excess = point.energy_j / energy_lt - 1
        worst_at_ours = max(worst_at_ours, excess)
        print(
            f"{point.deadline_s:11.5f} {point.time_s:9.5f} {point.energy_j:11.2f} {time_lt:10.5f} "
            f"{energy_lt:11.2f} {100 * excess:9.3f}"
        )
    planner = Planner(case.dag, case.profile, fingerprint=case.label)
    excesses = []
    for time_lt, energy_lt in lowtime:
        if time_lt >= planner.solver.min_time_s:
            excesses.append(planner.point_for_time(time_lt).energy_j / energy_lt - 1)
    worst_at_lowtime = max(excesses, default=-np.inf)
    print(
        f"at each of {len(excesses)} lowtime plans' times (our planner's plan for that time): ours − lowtime "
        f"worst {100 * worst_at_lowtime:+.3f} %, median {100 * statistics.median(excesses):+.3f} %"
    )
    return worst_at_ours, worst_at_lowtime


def bench_case(case: Case, repeats: int, lowtime_repeats: int) -> dict[str, float]:
    runs = [run_lowtime(case) for _ in range(lowtime_repeats)]
    plans, lowtime_s = runs[0][0], statistics.median(run[1] for run in runs)
    lowtime = [(r.iteration_time_s, r.total_energy_j) for r in (case.simulator.run(plan) for plan in plans)]
    max_time_s = max(t for t, _ in lowtime)
    ours = [run_ours(case, max_time_s) for _ in range(repeats)]
    frontier, ours_s = ours[0][0], statistics.median(run[1] for run in ours)
    worst_at_ours, worst_at_lowtime = compare(case, frontier, lowtime)
    gap = max(point.gap for point in frontier.points)
    print(
        f"{case.label}: lowtime {len(plans)} plans in {lowtime_s:.2f} s; ours {len(frontier.points)} "
        f"deadlines in {ours_s:.2f} s (x{lowtime_s / ours_s:.1f} faster); worst rounding gap to our lower "
        f"bound {100 * gap:.4f} %"
    )
    return {
        "lowtime_s": lowtime_s,
        "ours_s": ours_s,
        "worst_ours": worst_at_ours,
        "worst_lt": worst_at_lowtime,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="only the small case S=4 M=16")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of ours (median reported)")
    args = parser.parse_args()
    logging.getLogger("lowtime").setLevel(logging.WARNING)
    spec = load_gpu_spec(GPU)
    print(
        f"setup (modelled): {spec.display_name}, GPT-3 1.3B mbs {MICRO_BATCH}, clocks "
        f"{spec.max_sm_clock_mhz}-{MIN_CLOCK_MHZ} MHz, blocked {spec.blocked_power_w:g} W, idle "
        f"{spec.idle_power_w:g} W; lowtime unit time {1e3 * UNIT_TIME_S:g} ms; "
        f"ours {NUM_DEADLINES} deadlines; wall times measured here"
    )
    cases = CASES[:1] if args.quick else CASES
    results = {}
    for stages, microbatches, chunks in cases:
        case = build_case(stages, microbatches, chunks)
        lowtime_repeats = args.repeats if (stages, microbatches) == CASES[0][:2] else 1
        results[(stages, microbatches, chunks)] = bench_case(case, args.repeats, lowtime_repeats)
    if not args.quick:
        for stages, microbatches, chunks in OURS_ONLY:
            case = build_case(stages, microbatches, chunks)
            start = time.perf_counter()
            frontier = FrontierSolver(case.dag, case.profile).sweep(NUM_DEADLINES)
            elapsed = time.perf_counter() - start
            gap = max(point.gap for point in frontier.points)
            print(
                f"\n{case.label} (ours alone, {len(case.dag.nodes)} nodes): {len(frontier.points)} deadlines "
                f"in {elapsed:.1f} s; worst rounding gap {100 * gap:.4f} %; iso-time energy "
                f"{frontier.points[0].energy_j:.0f} J vs all-max {frontier.baseline.total_energy_j:.0f} J "
                "(modelled)"
            )
    print("\nacceptance:")
    ok = True
    for key, result in results.items():
        within = max(result["worst_ours"], result["worst_lt"]) <= TOLERANCE
        ok &= within
        print(
            f"  S={key[0]} M={key[1]}: ours <= lowtime (+{100 * TOLERANCE:.1f} %) at every matched time: "
            f"{within}"
        )
    if SPEEDUP_CASE in results:
        speedup = results[SPEEDUP_CASE]["lowtime_s"] / results[SPEEDUP_CASE]["ours_s"]
        ok &= speedup >= 20
        print(f"  S=8 M=64 full frontier speed-up x{speedup:.1f} >= 20: {speedup >= 20}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
