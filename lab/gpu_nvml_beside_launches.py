"""Whether the plugin's NVML reads from background threads slow the training thread's launches (read-only).

The plugin's background threads read NVML while training runs: the power sampler reads fields 185 and 186
(averaged and instant power) and the SM clock every ``--energy-power-sample-ms`` (50 ms by default,
``dvfs.power_sampler``), the energy meter reads the energy counter once a step
(``runtime.energy_log.meter_thread``). This probe times a loop of matrix products on the GPU, launch-bound
(256-square products, as a host-bound step) and GPU-bound (4096-square), while another thread
does nothing, does the sampler's reads at its period, or reads the energy counter at a step's rate, in
alternating blocks (``--rounds`` rounds of every condition, the order rotated each round). Per condition: the
median over blocks of the loop's time per product (CUDA events around each block; *measured*), and its ratio
to the quiet blocks'. It only reads NVML; it never sets anything.

    python lab/gpu_nvml_beside_launches.py [--rounds 6] [--block-s 2] [--sample-ms 50] [--energy-ms 300]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Callable

CONDITIONS = ("quiet", "power sampler reads", "energy counter reads")


def reader(kind: str, handle: object, period_s: float) -> Callable[[threading.Event], None]:
    """A thread body that does ``kind``'s NVML reads every ``period_s`` until the event is set."""
    import pynvml

    def sampler_reads() -> None:
        pynvml.nvmlDeviceGetFieldValues(handle, [185, 186])
        pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)

    def energy_reads() -> None:
        pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)

    read = {"power sampler reads": sampler_reads, "energy counter reads": energy_reads}.get(kind)

    def run(stop: threading.Event) -> None:
        while read is not None and not stop.wait(period_s):
            read()

    return run


def block_s_per_product(size: int, products: int) -> float:
    """Seconds per product of ``products`` ``size``-square products in a row, timed with CUDA events."""
    import torch

    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(products):
        a = a @ a
        a.clamp_(-1, 1)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / products


def products_per_block(size: int, block_s: float) -> int:
    """How many products of ``size`` fill about ``block_s`` seconds."""
    block_s_per_product(size, 50)  # warm up
    return max(50, int(block_s / block_s_per_product(size, 200)))


def main() -> None:
    """Alternate the conditions in blocks and print each one's median time per product and ratio."""
    import pynvml

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=6, help="rounds of every condition")
    parser.add_argument("--block-s", type=float, default=2.0, help="seconds of one block")
    parser.add_argument("--sample-ms", type=float, default=50.0, help="the power sampler's period")
    parser.add_argument("--energy-ms", type=float, default=300.0, help="the energy counter reads' period")
    args = parser.parse_args()
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    periods = {
        "quiet": 1.0,
        "power sampler reads": args.sample_ms / 1e3,
        "energy counter reads": args.energy_ms / 1e3,
    }
    for label, size in (("launch-bound (256-square bf16 products)", 256), ("GPU-bound (4096-square)", 4096)):
        products = products_per_block(size, args.block_s)
        times: dict[str, list[float]] = {condition: [] for condition in CONDITIONS}
        for round_index in range(args.rounds):
            order = CONDITIONS[round_index % 3 :] + CONDITIONS[: round_index % 3]
            for condition in order:
                stop = threading.Event()
                thread = threading.Thread(target=reader(condition, handle, periods[condition]), args=(stop,))
                thread.start()
                time.sleep(0.05)
                times[condition].append(block_s_per_product(size, products))
                stop.set()
                thread.join()
        quiet = statistics.median(times["quiet"])
        print(f"{label}, {products} products a block, {args.rounds} blocks each (measured, CUDA events):")
        for condition in CONDITIONS:
            median = statistics.median(times[condition])
            print(f"  {condition:22s} {median * 1e6:9.2f} us per product  x{median / quiet:.4f}")
    pynvml.nvmlShutdown()


if __name__ == "__main__":
    main()
