"""The session's collectives kept off the GPU: gloo groups of the job's pipeline, tensor and data groups.

An NCCL collective, even of a few bytes, is queued on the GPU's compute stream and its result read back on
the host, so the host would wait for every kernel queued before it. Under a gloo job (CPU) the job's own
groups already are CPU groups and are used as they are. Under an NCCL job each rank creates, once, at the
session's start, a gloo group of the same ranks as each of its three job groups of more than one rank
(``runtime.control_plane.comms``: pipeline, tensor, data): ``new_group(...,
use_local_synchronization=True)``, so only the group's own ranks take part in creating it (no world-wide
barrier, no gloo group of the world, ~3 groups per rank whatever the job's size; every rank creates them in
the same order, which keeps torch's group names consistent). A rank tries every one of its groups even after
one failed, so it never leaves the peers of the next waiting (a creation whose peer never comes fails after
the process group's timeout). Whether every rank succeeded is then agreed on in one small reduction over the
job's own groups; if any rank failed, every rank uses the job's groups and says so once, so no two ranks ever
talk over different communicators.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from megatron_energy.runtime.control_plane.comms import GROUPS, Group, TorchComms
from megatron_energy.runtime.control_plane.group_chain import reduce_everywhere

logger = logging.getLogger(__name__)


def control_plane_comms(job_groups: Mapping[Group, Any], device: str) -> TorchComms:
    """The session's collectives: over gloo groups of the same ranks as the job's (see the module docstring).

    Args:
        job_groups: Megatron's pipeline, tensor(-and-context) and data-parallel groups of this rank.
        device: The job's device (``cuda`` or ``cpu``).

    Returns:
        The collectives.
    """
    import torch.distributed as dist

    backend = str(dist.get_backend())
    if backend == "gloo":
        return TorchComms(job_groups, device="cpu")
    job = TorchComms(job_groups, device=device)
    made = dict(job_groups)
    problem: Exception | None = (
        None if dist.is_gloo_available() else RuntimeError("this torch has no gloo backend")
    )
    for name in GROUPS if problem is None else ():
        if job.size(name) == 1:
            continue
        try:  # each group on its own: a failure here must not leave this group's peers waiting in the next
            ranks = dist.get_process_group_ranks(job_groups[name])
            made[name] = dist.new_group(ranks, backend="gloo", use_local_synchronization=True)
        except Exception as error:  # agreed on below: some rank may have failed where the others did not
            problem = error
    (failed_anywhere,) = reduce_everywhere(job, [0.0 if problem is None else 1.0])
    if not failed_anywhere:
        return TorchComms(made, device="cpu")
    why = problem if problem is not None else "another rank could not create its gloo groups"
    logger.info(
        f"[energy] rank {dist.get_rank()}: no gloo groups ({why}); the session's messages go over the job's "
        f"{backend} groups, and each waits for the GPU's queued work"
    )
    return job
