r"""GPU memory of the extra NCCL communicators a plan's CTA budgets need, one communicator per budget.

A budget that varies within an iteration needs one communicator per budget over the same ranks
(``megatron_energy.megatron.communicators``). This script creates them the way the runtime does (options from
megatron-core's ``parallel_state.get_nccl_options`` with ``min_ctas = max_ctas = budget``), forces each
communicator's initialisation with one collective of ``--message-bytes``, and reads the memory before
and after each: ``torch.cuda.memory_reserved`` (PyTorch's caching allocator; NCCL's own buffers are outside
it) and NVML's used memory of the device (everything on the GPU, other processes included, so run it on an
otherwise idle GPU and look at the repeats). All figures are *measured*. It reads only: no clock, power or
NCCL environment setting is changed.

One process gives a 1-rank communicator, whose buffers are smaller than a multi-rank one's (NCCL sets up no
ring or tree peers for a single rank): a lower bound. Under ``torchrun --nproc-per-node N`` the same script
measures N-rank communicators (each rank reports its own GPU).

    python lab/measure_communicator_memory.py --budgets 1 2 4 8 16 32 --out communicator_memory.json
    torchrun --nproc-per-node 2 lab/measure_communicator_memory.py --out communicator_memory.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path
from typing import Any


def _nvml_used(uuid: str) -> int | None:
    """NVML's used memory of the GPU with this UUID (NVML ignores CUDA_VISIBLE_DEVICES, so not by index)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
    except Exception:  # NVML missing or the device not found: report the allocator figure only
        return None


def _snapshot(uuid: str) -> dict[str, int | None]:
    import torch

    torch.cuda.synchronize()
    return {"reserved_bytes": int(torch.cuda.memory_reserved()), "nvml_used_bytes": _nvml_used(uuid)}


def _delta(before: dict[str, int | None], after: dict[str, int | None]) -> dict[str, int | None]:
    return {
        key: None if before[key] is None or after[key] is None else after[key] - before[key]  # type: ignore[operator]
        for key in before
    }


def measure_communicator_memory(
    budgets: tuple[int, ...] = (1, 2, 4, 8, 16, 32), message_bytes: int = 64 << 20, repeats: int = 2
) -> dict[str, Any]:
    """Create one communicator per budget (``repeats`` times each) and measure what each one adds.

    Args:
        budgets: CTA budgets, one communicator each per repeat.
        message_bytes: Size of the all-reduce that initialises each communicator (NCCL sizes some buffers
            lazily by protocol and algorithm, so a realistic bucket size is used).
        repeats: Communicators per budget (all kept alive, as the runtime keeps them).

    Returns:
        The device, the default communicator's cost and one row per communicator created.
    """
    import torch
    import torch.distributed as dist

    from megatron_energy.megatron.communicators import nccl_options
    from megatron_energy.runtime.running.communicator_budgets import CtaBudget

    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29577")
    torch.cuda.set_device(local_rank)
    properties = torch.cuda.get_device_properties(local_rank)
    uuid = f"GPU-{properties.uuid}"
    device = torch.device("cuda", local_rank)
    tensor = torch.ones(max(1, message_bytes // 2), dtype=torch.bfloat16, device=device)
    start = _snapshot(uuid)
    dist.init_process_group(
        "nccl", rank=rank, world_size=world_size, timeout=datetime.timedelta(minutes=5), device_id=device
    )
    dist.all_reduce(tensor)
    default = _delta(start, _snapshot(uuid))
    rows = []
    keep = []
    ranks = list(range(world_size))
    for repeat in range(repeats):
        for ctas in budgets:
            before = _snapshot(uuid)
            group = dist.new_group(ranks, backend="nccl", pg_options=nccl_options(CtaBudget("dp_cp", ctas)))
            dist.all_reduce(tensor, group=group)
            after = _snapshot(uuid)
            keep.append(group)
            rows.append({"max_ctas": ctas, "min_ctas": ctas, "repeat": repeat, **_delta(before, after)})
    result = {
        "provenance": "measured",
        "device": properties.name,
        "rank": rank,
        "world_size": world_size,
        "message_bytes": message_bytes,
        "torch": torch.__version__,
        "nccl": ".".join(str(part) for part in torch.cuda.nccl.version()),
        "default_communicator": default,
        "communicators": rows,
        "total_extra": _delta(start, _snapshot(uuid)),
    }
    dist.destroy_process_group()
    return result


def main(argv: list[str] | None = None) -> int:
    """Command line: measure and print (and write) the result as JSON."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--budgets", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--message-bytes", type=int, default=64 << 20)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="JSON file (rank N writes FILE.rankN)")
    args = parser.parse_args(argv)
    result = measure_communicator_memory(tuple(args.budgets), args.message_bytes, args.repeats)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out is not None:
        out = (
            args.out
            if result["world_size"] == 1
            else args.out.with_name(f"{args.out.name}.rank{result['rank']}")
        )
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
