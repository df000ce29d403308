"""The demo's training job: a tiny GPT trained on CPU with megatron-core's real pipeline schedules.

``megatron-energy demo`` runs :data:`TRAINING_SCRIPT` under ``torch.distributed.run`` through the energy
launcher, exactly as a GPU job runs ``pretrain_gpt.py``; the tests build the same model in gloo worlds of
their own. Nothing else in the package imports this package: the CPU shims it holds
(:mod:`~megatron_energy.demo_model.cpu_shims`) change torch only in a process that installs them, the demo's
ranks and the tests.

Modules:

- :mod:`~megatron_energy.demo_model.cpu_shims`: what megatron-core needs to run its schedules without CUDA.
- :mod:`~megatron_energy.demo_model.tiny_gpt`: the tiny ``GPTModel`` split over the pipeline, and one step.
- :mod:`~megatron_energy.demo_model.pretrain_tiny_gpt`: the training script (Megatron's arguments and log).
"""

from pathlib import Path

from megatron_energy.launch_output import KNOWN_WARNINGS

TRAINING_SCRIPT = Path(__file__).resolve().with_name("pretrain_tiny_gpt.py")
"""The demo's training script, run as ``__main__`` by ``python -m megatron_energy.launch``."""


def python_warnings_filter() -> str:
    """A ``PYTHONWARNINGS`` value that hides ``launch_output.KNOWN_WARNINGS`` from interpreter start on.

    Those are megatron-core's warnings about a missing Transformer Engine, Apex or absl: a CPU run never
    has them.

    Set in the environment of the demo's ranks, it applies before anything imports megatron (the launcher
    imports it before the training script runs).
    """
    return ",".join(f"ignore:{start}:UserWarning" for start in KNOWN_WARNINGS)
