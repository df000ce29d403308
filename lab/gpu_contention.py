r"""Single-GPU contention check: bf16 GEMMs beside a CTA-limited copy kernel, measured vs modelled.

Read-only on the GPU: it never sets clocks, power limits or any other device setting; it installs nothing.
Every window is held ``--window-s`` seconds (>= 5 s, so the ~100 ms energy counter advances 50 times) and
every configuration runs ``--rounds`` times (>= 3), alternating:

* ``gemm``: groups of ``--gemms`` bf16 ``--n``-cubed GEMMs on the main stream;
* ``copy:N``: a Triton copy kernel with a fixed grid of N CTAs (each loops over its share of the buffer),
  moving ``--copy-gib`` GiB (read + written) per group, alone;
* ``overlap:N``: both in each group: the copy on a side stream, launched once the first ``--launch-after``
  GEMMs of the group are done (a CUDA event), the group ending when both have finished.

Time per group comes from CUDA events over the window; energy from NVML's total-energy counter (read only:
``nvmlDeviceGetTotalEnergyConsumption`` through pynvml, or ``nvidia-smi --query-gpu=total_energy_consumption``
when pynvml is missing), as the slope of the counter over its updates inside the window times the time per
group; the SM clock NVML reports is read beside the counter (median per window). After the windows, one group
per overlap configuration is timed kernel by kernel (CUDA events: each GEMM's end, the copy's start and end;
the second of two groups is kept) and written to the JSON as ``timelines``, and one more group at the fewest
CTAs with a sixteenth of the bytes, so that its copy ends beside the GEMMs (``beside_timeline``). The modelled
figures come from ``lab/contention_check.py`` (the planner's overlap simulator, calibrated on the
isolated windows, on the overlap window with the fewest CTAs and on its timelines; those rows are marked as
calibration and left out of the verdict). Prints per configuration measured vs modelled time and energy and
their relative errors; ``--json OUT`` writes everything. ``--replay OUT`` recomputes the modelled side from
the windows of an earlier run (no GPU needed); ``--beside-from OTHER`` takes the copy's rate beside the GEMMs
from another run's calibration timeline when this run has none whose copy ended beside them.

    PYTHONPATH=. python3 lab/gpu_contention.py --json contention.json
    PYTHONPATH=. python3 lab/gpu_contention.py --replay tests/data/h200_contention.json \
        --beside-from tests/data/h200_contention_long.json

Defaults: 11 configurations x 3 rounds x 5 s windows + 1 s gaps: about 3.5 minutes plus warm-up.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch
import triton
import triton.language as tl
from contention_check import CheckSetup, Comparison, Window, beside_rate_gbps, compare

from megatron_energy.dvfs.calibration import power_from_counter
from megatron_energy.dvfs.spec import load_gpu_spec

RAMP_S = 0.3
"""Counter updates in the first RAMP_S of a window are left out (clock and power settle)."""
GAP_S = 1.0
"""Pause between windows."""
IN_FLIGHT_GROUPS = 4
"""Groups enqueued ahead of the GPU."""
COPY_BLOCK = 8192
"""Elements (fp32) one CTA copies per loop step."""
COPY_WARPS = 8
"""Warps per copy CTA (256 threads)."""
MAX_CTAS_PER_SM = 32
"""Hopper's limit of resident CTAs per SM."""
REGISTERS_PER_SM = 65536
"""Hopper's register file per SM (32-bit registers), when torch does not report it."""


@triton.jit
def _copy_kernel(src, dst, n_elements, BLOCK: tl.constexpr):  # noqa: N803
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    for start in tl.range(pid * BLOCK, n_elements, step):
        offsets = start + tl.arange(0, BLOCK)
        mask = offsets < n_elements
        tl.store(dst + offsets, tl.load(src + offsets, mask=mask), mask=mask)


class EnergyCounter:
    """Polls the GPU's total-energy counter (joules) in a thread: pynvml, else nvidia-smi (read only)."""

    def __init__(self, index: int, poll_s: float):
        self.samples: list[tuple[float, float]] = []
        self.clocks: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._poll_s = poll_s
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self.source = "pynvml nvmlDeviceGetTotalEnergyConsumption"
            self._read = lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1e3
            self._read_clock = lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
            self._thread = threading.Thread(target=self._poll, daemon=True)
        except Exception:  # no pynvml, or NVML will not start: read the counter through nvidia-smi
            if shutil.which("nvidia-smi") is None:
                sys.exit("neither pynvml nor nvidia-smi is available to read the energy counter")
            self.source = "nvidia-smi --query-gpu=total_energy_consumption -lms 20"
            self._process = subprocess.Popen(
                [
                    "nvidia-smi",
                    f"--id={index}",
                    "--query-gpu=total_energy_consumption",
                    "--format=csv,noheader,nounits",
                    "-lms",
                    "20",
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            self._thread = threading.Thread(target=self._stream, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            now = time.perf_counter()
            self.samples.append((now, self._read()))
            self.clocks.append((now, float(self._read_clock())))
            time.sleep(self._poll_s)

    def _stream(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            if self._stop.is_set():
                break
            try:
                self.samples.append((time.perf_counter(), float(line.strip()) / 1e3))
            except ValueError:
                continue

    def power_w(self, start_s: float, end_s: float) -> float:
        """Slope of the counter over its updates in ``[start_s + RAMP_S, end_s]``."""
        inside = [(t, e) for t, e in list(self.samples) if start_s + RAMP_S <= t <= end_s]
        return power_from_counter([t for t, _ in inside], [e for _, e in inside])[0]

    def clock_mhz(self, start_s: float, end_s: float) -> float | None:
        """Median SM clock read in ``[start_s + RAMP_S, end_s]`` (``None`` on the nvidia-smi path)."""
        inside = sorted(c for t, c in list(self.clocks) if start_s + RAMP_S <= t <= end_s)
        return inside[len(inside) // 2] if inside else None

    def close(self) -> None:
        """Stop polling."""
        self._stop.set()
        if hasattr(self, "_process"):
            self._process.terminate()


class Workload:
    """The GEMMs, the copy buffers and the streams."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        n = args.n
        self.a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        self.b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        self.c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
        elements = int(args.copy_gib * 2**30 / 2 / 4)  # fp32 elements; read + written = copy_gib
        self.src = torch.rand(elements, device="cuda", dtype=torch.float32)
        self.dst = torch.empty_like(self.src)
        self.side = torch.cuda.Stream()
        self.copy_bytes = 2 * 4 * elements

    def copy(self, ctas: int, elements: int = 0) -> None:
        """Enqueue the copy of ``elements`` (0: the whole buffer) on the current stream with ``ctas`` CTAs."""
        count = elements or self.src.numel()
        _copy_kernel[(ctas,)](self.src, self.dst, count, BLOCK=COPY_BLOCK, num_warps=COPY_WARPS)

    def group(self, config: str, ctas: int | None) -> None:
        """Enqueue one group of ``config``."""
        main = torch.cuda.current_stream()
        if config == "copy":
            assert ctas is not None
            self.copy(ctas)
            return
        for i in range(self.args.gemms):
            if config == "overlap" and i == self.args.launch_after:
                ready = torch.cuda.Event()
                ready.record(main)
                self.side.wait_event(ready)
                with torch.cuda.stream(self.side):
                    assert ctas is not None
                    self.copy(ctas)
            torch.matmul(self.a, self.b, out=self.c)
        if config == "overlap":
            done = torch.cuda.Event()
            done.record(self.side)
            main.wait_event(done)


def run_window(
    workload: Workload, counter: EnergyCounter, config: str, ctas: int | None, window_s: float
) -> Window:
    """Hold one configuration for ``window_s``; time per group from CUDA events, power from the counter."""
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    pending: list[torch.cuda.Event] = []
    host_start = time.perf_counter()
    start.record()
    groups = 0
    while time.perf_counter() - host_start < window_s:
        workload.group(config, ctas)
        marker = torch.cuda.Event()
        marker.record()
        pending.append(marker)
        groups += 1
        if len(pending) > IN_FLIGHT_GROUPS:
            pending.pop(0).synchronize()
    end.record()
    end.synchronize()
    host_end = time.perf_counter()
    time_s = start.elapsed_time(end) / 1e3 / groups
    return Window(
        config, ctas, time_s, counter.power_w(host_start, host_end), counter.clock_mhz(host_start, host_end)
    )


def kernel_timeline(workload: Workload, ctas: int, elements: int = 0) -> dict[str, object]:
    """One overlap group's kernels in ms from its start (CUDA events): each GEMM's end, the copy's span.

    ``elements``: the copy's (0: the whole buffer).
    """
    args, main = workload.args, torch.cuda.current_stream()
    torch.cuda.synchronize()

    def event() -> torch.cuda.Event:
        return torch.cuda.Event(enable_timing=True)

    start, copy_start, copy_end = event(), event(), event()
    gemm_ends = [event() for _ in range(args.gemms)]
    start.record(main)
    for i in range(args.gemms):
        if i == args.launch_after:
            workload.side.wait_event(gemm_ends[i - 1] if i else start)
            with torch.cuda.stream(workload.side):
                copy_start.record(workload.side)
                workload.copy(ctas, elements)
                copy_end.record(workload.side)
        torch.matmul(workload.a, workload.b, out=workload.c)
        gemm_ends[i].record(main)
    torch.cuda.synchronize()
    return {
        "gemm_end_ms": [start.elapsed_time(e) for e in gemm_ends],
        "copy_start_ms": start.elapsed_time(copy_start),
        "copy_end_ms": start.elapsed_time(copy_end),
    }


def copy_ctas_per_sm(workload: Workload) -> int:
    """The copy kernel's occupancy: CTAs one SM can hold (threads, registers, the 32-CTA limit)."""
    compiled = _copy_kernel[(1,)](workload.src, workload.dst, 1, BLOCK=COPY_BLOCK, num_warps=COPY_WARPS)
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    threads = 32 * COPY_WARPS
    limits = [props.max_threads_per_multi_processor // threads, MAX_CTAS_PER_SM]
    registers = getattr(compiled, "n_regs", 0)
    if registers:
        limits.append(getattr(props, "regs_per_multiprocessor", REGISTERS_PER_SM) // (threads * registers))
    return max(1, min(limits))


def report(
    setup: CheckSetup, windows: list[Window], args: argparse.Namespace, extra: dict[str, object]
) -> None:
    """Print measured vs modelled per configuration and the verdict; write ``--json`` when given."""
    spec = load_gpu_spec(args.spec)
    timelines = extra.get("timelines") or {}
    assert isinstance(timelines, dict)
    calibration, rows = compare(spec, setup, windows, timelines, _beside_gbps(args, setup, extra))
    law, power, burst = calibration.law, calibration.power, calibration.burst
    alone = "-" if calibration.sm_alone_gbps is None else f"{calibration.sm_alone_gbps:.1f}"
    exponent = calibration.power_exponent
    rise = "the spec's voltage curve" if exponent is None else f"(f/f_cap)^{exponent:.2f}"
    print(
        f"calibration: copy alone {law.link_gbps:.0f} GB/s saturated, {law.per_cta_gbps:.1f} GB/s per CTA, "
        f"knee p={law.knee:.2f} (bytes read + written), {power.base_w:.1f} W + {power.per_gbps_w:.4f} W per "
        f"GB/s above blocked; packed {setup.ctas_per_sm} CTAs per SM: {calibration.sm_beside_gbps:.1f} GB/s "
        f"per SM beside the GEMMs, {alone} alone; burst GEMM {1e3 * burst.gemm_s:.3f} ms, slowed "
        f"x{burst.slowdown:.3f} beside the copy beyond its SM share; GEMM power above idle rises above the "
        f"cap clock as {rise}"
    )
    print(
        f"{'config':12s} {'meas ms':>9s} {'model ms':>9s} {'t err':>7s} {'meas J':>8s} {'model J':>8s} "
        f"{'E err':>7s} {'spread t/E':>11s} {'meas MHz':>8s} {'model MHz':>9s}"
    )
    worst = 0.0
    for row in rows:
        note = "  (calibration)" if row.calibration else ""
        modelled_mhz = row.prediction.clock_mhz if row.prediction else None
        print(
            f"{row.key:12s} {1e3 * row.measured_time_s:9.3f} {1e3 * row.modelled_time_s:9.3f} "
            f"{row.time_error:+7.2%} {row.measured_energy_j:8.2f} {row.modelled_energy_j:8.2f} "
            f"{row.energy_error:+7.2%} {row.time_spread:5.1%}/{row.energy_spread:4.1%} "
            f"{_mhz(row.measured_clock_mhz):>8s} {_mhz(modelled_mhz):>9s}{note}"
        )
        if not row.calibration:
            worst = max(worst, abs(row.time_error), abs(row.energy_error))
    verdict = "within" if worst <= 0.05 else "OUTSIDE"
    print(
        f"predicted configurations: worst |modelled/measured - 1| = {worst:.2%} ({verdict} the 5 % "
        f"target); measured = CUDA events + energy counter over {args.rounds} x {args.window_s:g} s windows, "
        f"meas MHz = median SM clock over the window (NVML); modelled = sim.overlap with spec {spec.name}, "
        f"model MHz = the GEMMs' clock (the group's mean power held at the GEMMs-alone window's)"
    )
    print_timelines(rows, extra.get("timelines"))
    if args.json:
        document = {
            **extra,
            "setup": dataclasses.asdict(setup),
            "windows": [dataclasses.asdict(w) for w in windows],
            "calibration": dataclasses.asdict(calibration),
            "rows": [
                {**dataclasses.asdict(r), "time_error": r.time_error, "energy_error": r.energy_error}
                for r in rows
            ],
            "worst_prediction_error": worst,
        }
        args.json.write_text(json.dumps(document, indent=1))


def _beside_gbps(args: argparse.Namespace, setup: CheckSetup, extra: dict[str, object]) -> float | None:
    """The copy's per-SM rate beside the GEMMs from a group whose copy ended before them (None: none).

    With ``--beside-from``: that run's ``beside_timeline``, else its calibration configuration's timeline;
    otherwise this run's ``beside_timeline``.
    """
    timeline = extra.get("beside_timeline")
    if args.beside_from:
        other = json.loads(args.beside_from.read_text())
        setup = CheckSetup(**other["setup"])
        ctas = min(int(key.split(":")[1]) for key in other["timelines"])
        first = {**other["timelines"][f"overlap:{ctas}"], "ctas": ctas, "copy_bytes": setup.copy_bytes}
        timeline = other.get("beside_timeline", first)
    if not isinstance(timeline, dict):
        return None
    return beside_rate_gbps(timeline["copy_bytes"], setup.held_sms(timeline["ctas"]), timeline)


def _mhz(clock: float | None) -> str:
    return "-" if clock is None else f"{clock:.0f}"


def print_timelines(rows: list[Comparison], timelines: object) -> None:
    """Per overlap configuration: the copy's span and the GEMMs' end, measured (one group) and modelled."""
    measured = timelines if isinstance(timelines, dict) else {}
    for row in rows:
        if row.prediction is None or row.prediction.copy_span_s is None:
            continue
        start_s, end_s = row.prediction.copy_span_s
        line = (
            f"{row.key}: modelled copy {1e3 * start_s:.2f}-{1e3 * end_s:.2f} ms, GEMMs end "
            f"{1e3 * row.prediction.gemms_end_s:.2f} ms"
        )
        if row.key in measured:
            events = measured[row.key]
            line += (
                f"; measured (CUDA events, one group) copy {events['copy_start_ms']:.2f}-"
                f"{events['copy_end_ms']:.2f} ms, GEMMs end {events['gemm_end_ms'][-1]:.2f} ms"
            )
        print(line)


def replay(args: argparse.Namespace) -> int:
    """Recompute the comparison from an earlier run's windows (``--replay``)."""
    recorded = json.loads(args.replay.read_text())
    ctas_per_sm = args.ctas_per_sm or recorded["setup"].get("ctas_per_sm", 1)
    setup = CheckSetup(**{**recorded["setup"], "ctas_per_sm": ctas_per_sm})
    windows = [Window(**w) for w in recorded["windows"]]
    rounds = max(sum(1 for w in windows if w.key == key) for key in {w.key for w in windows})
    args.rounds = rounds
    print(f"replaying {len(windows)} windows measured on {recorded.get('gpu')} (model recomputed on CPU)")
    keys = ("gpu", "counter", "timelines", "beside_timeline")
    kept = {key: recorded[key] for key in keys if key in recorded}
    try:
        report(setup, windows, args, kept)
    except ValueError as error:  # e.g. no copy of this run ended beside its GEMMs: --beside-from is needed
        sys.exit(f"replay: {error} (--beside-from)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpu", type=int, default=0, help="CUDA device index")
    parser.add_argument("--spec", default="h200", help="GPU spec of configs/gpus/ the model uses")
    parser.add_argument("--ctas", default="8,16,32,66,132", help="copy CTA counts")
    parser.add_argument("--window-s", type=float, default=5.0, help="seconds per window (>= 5)")
    parser.add_argument("--rounds", type=int, default=3, help="alternations of every configuration (>= 3)")
    parser.add_argument("--n", type=int, default=8192, help="GEMM size (n x n x n, bf16)")
    parser.add_argument("--gemms", type=int, default=8, help="GEMMs per group (even)")
    parser.add_argument(
        "--launch-after", type=int, default=2, help="GEMMs of a group before the copy launches"
    )
    parser.add_argument("--copy-gib", type=float, default=8.0, help="GiB the copy reads + writes per group")
    parser.add_argument("--poll-s", type=float, default=0.005, help="energy-counter polling period")
    parser.add_argument("--json", type=Path, help="write windows, fit and comparison here")
    parser.add_argument(
        "--ctas-per-sm", type=int, default=0, help="copy CTAs per SM when packed (0: the kernel's occupancy)"
    )
    parser.add_argument("--replay", type=Path, help="recompute the model for the windows of this --json file")
    parser.add_argument(
        "--beside-from", type=Path, help="take the copy's rate beside the GEMMs from this run's --json file"
    )
    args = parser.parse_args()
    if args.replay:
        return replay(args)
    if args.window_s < 5 or args.rounds < 3:
        parser.error("windows of >= 5 s and >= 3 rounds are needed to resolve the 100 ms energy counter")
    torch.cuda.set_device(args.gpu)
    ctas_list = [int(c) for c in args.ctas.split(",")]
    workload = Workload(args)
    setup = CheckSetup(
        args.gemms, args.launch_after, workload.copy_bytes, args.ctas_per_sm or copy_ctas_per_sm(workload)
    )
    counter = EnergyCounter(args.gpu, args.poll_s)
    configs: list[tuple[str, int | None]] = [("gemm", None)]
    configs += [("copy", c) for c in ctas_list] + [("overlap", c) for c in ctas_list]
    print(
        f"{torch.cuda.get_device_name()}: energy counter via {counter.source}; clocks untouched (read only)"
    )
    for config, ctas in configs:  # warm-up: compile the kernel, settle the clock
        for _ in range(2):
            workload.group(config, ctas)
    torch.cuda.synchronize()
    windows: list[Window] = []
    started = time.perf_counter()
    for round_index in range(args.rounds):
        for config, ctas in configs:
            window = run_window(workload, counter, config, ctas, args.window_s)
            windows.append(window)
            print(
                f"round {round_index} {window.key:12s} {1e3 * window.time_s:9.3f} ms/group "
                f"{window.power_w:7.1f} W {window.clock_mhz or 0:6.0f} MHz (measured)",
                flush=True,
            )
            time.sleep(GAP_S)
    counter.close()
    print(f"measuring took {time.perf_counter() - started:.0f} s")
    timelines = {f"overlap:{c}": [kernel_timeline(workload, c) for _ in range(2)][-1] for c in ctas_list}
    fewest, elements = min(ctas_list), workload.src.numel() // 16
    beside = [kernel_timeline(workload, fewest, elements) for _ in range(2)][-1]
    extra = {
        "gpu": torch.cuda.get_device_name(),
        "counter": counter.source,
        "timelines": timelines,
        "beside_timeline": {"ctas": fewest, "copy_bytes": 2 * 4 * elements, **beside},
    }
    report(setup, windows, args, extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
