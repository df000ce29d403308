"""What ``megatron-energy demo`` runs: the launcher command line of its CPU training job.

A :class:`DemoJob` holds the demo's choices (model, pipeline size, microbatches, iterations after profiling)
and the ``--energy-*`` configuration, and turns them into the command a user would type for a real job::

    python -m torch.distributed.run --nproc-per-node 4 ... -m megatron_energy.launch \
        .../megatron_energy/demo_model/pretrain_tiny_gpt.py <Megatron args> --energy-optimise ...

The Megatron arguments describe the real model (e.g. GPT-3 1.3B), whose stage work the simulated GPUs time
through the launcher's session; the training script runs a tiny CPU stand-in with the same pipeline layout.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from megatron_energy.config import EnergyConfig, energy_argv
from megatron_energy.demo_model import TRAINING_SCRIPT
from megatron_energy.dvfs.spec import load_gpu_spec
from megatron_energy.pipeline.schedule_orders import pipeline_orders
from megatron_energy.pipeline.workload import KNOWN_SHAPES, TransformerShape
from megatron_energy.runtime.assembly import profiling_grid
from megatron_energy.runtime.profiling.baseline_length import pilot_steps
from megatron_energy.sim.power_floor import modelled_floor_problem

DEMO_FOLDER = "demo"
"""The demo's own files go to ``<energy dir>/demo/``: every rank's output, the energy log, TensorBoard."""


@dataclass(frozen=True)
class DemoJob:
    """One run of the demo."""

    model: str
    """A name of ``KNOWN_SHAPES``: the model whose stage work the simulated GPUs time."""

    pipeline_size: int
    """Pipeline stages, one process each."""

    num_microbatches: int
    """Microbatches per iteration."""

    run_iters: int
    """Iterations after profiling (all iterations run with the plan when the cache already holds it)."""

    energy: EnergyConfig
    """The ``--energy-*`` configuration (always optimising, on simulated GPUs)."""

    tensorboard: bool = True
    """Whether Megatron writes TensorBoard scalars (the launcher's energy scalars among them)."""

    run_tag: str = field(default_factory=lambda: datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"))
    """This run's name among the demo's TensorBoard runs (when it started, UTC), so runs never mix."""

    @property
    def shape(self) -> TransformerShape:
        """The model's shape."""
        return TransformerShape.from_name(self.model)

    @property
    def folder(self) -> Path:
        """Where the demo's own files go."""
        return Path(self.energy.dir) / DEMO_FOLDER

    @property
    def log_file(self) -> Path:
        """The ``--energy-log-file`` the ranks write."""
        return self.folder / "energy_log.jsonl"

    @property
    def ranks_log(self) -> Path:
        """Every rank's output, in full."""
        return self.folder / "ranks.log"

    @property
    def tensorboard_dir(self) -> Path:
        """Megatron's ``--tensorboard-dir``: a folder of this run's own under the demo's TensorBoard runs."""
        return self.folder / "tensorboard" / self.run_tag

    @property
    def profiling_iters(self) -> int:
        """Iterations the profiling grid takes: a settling and ``profile_iters`` measured ones per clock.

        The stock clock also measures its baseline, whose length is the pilot: the demo's simulated GPUs
        report exact energies, whose spread is nil, so the baseline never asks for more
        (``runtime.profiling.baseline_length``).
        """
        spec = load_gpu_spec(self.energy.gpu_spec or "")
        grid = profiling_grid(self.energy.freq_grid, spec.sm_clocks_mhz)
        per_clock = self.energy.profile_iters + 1
        return pilot_steps(self.energy.profile_iters) + len(grid) * per_clock

    @property
    def train_iters(self) -> int:
        """Megatron's ``--train-iters``: profiling, then ``run_iters``."""
        return self.profiling_iters + self.run_iters

    def problem(self) -> str | None:
        """Why Megatron would refuse this job, or why its power budget is out of modelled reach; else None."""
        if self.model not in KNOWN_SHAPES:
            return f"unknown model {self.model!r}; use one of {', '.join(KNOWN_SHAPES)}"
        layers = self.shape.num_layers
        if layers % self.pipeline_size:
            return (
                f"{self.model} has {layers} layers, which {self.pipeline_size} pipeline stages do not "
                f"divide; use a divisor of {layers}"
            )
        if self.energy.target.kind != "power":
            return None
        orders = pipeline_orders(self.pipeline_size, self.num_microbatches)
        spec = load_gpu_spec(self.energy.gpu_spec or "")
        return modelled_floor_problem(self.energy.target, self.shape, spec, orders)  # before any profiling

    def megatron_args(self) -> list[str]:
        """Megatron's arguments: the model's shape, the batch, the iterations, mock data, logging."""
        shape = self.shape
        args = [
            "--pipeline-model-parallel-size", str(self.pipeline_size),
            "--num-layers", str(shape.num_layers),
            "--hidden-size", str(shape.hidden_size),
            "--ffn-hidden-size", str(shape.ffn_hidden_size),
            "--num-attention-heads", str(shape.num_attention_heads),
            "--seq-length", str(shape.seq_length),
            "--max-position-embeddings", str(shape.seq_length),
            "--vocab-size", str(shape.vocab_size),
            "--make-vocab-size-divisible-by", "1",  # the model's own vocabulary, not a padded one
            "--micro-batch-size", str(shape.micro_batch_size),
            "--global-batch-size", str(shape.micro_batch_size * self.num_microbatches),
            "--train-iters", str(self.train_iters),
            "--log-interval", "1",
            "--lr", "1e-4",
            "--mock-data", "--tokenizer-type", "NullTokenizer",
            "--no-one-logger",
            "--bf16",  # as the model trains: the simulated GPUs price its GEMMs as bf16 products
        ]  # fmt: skip
        if shape.gated_mlp:
            args.append("--swiglu")
        if shape.num_query_groups is not None:
            args += ["--group-query-attention", "--num-query-groups", str(shape.num_query_groups)]
        if self.tensorboard:
            args += ["--tensorboard-dir", str(self.tensorboard_dir)]
        return args

    def launcher_energy_config(self) -> EnergyConfig:
        """The configuration the ranks get: the demo's, on simulated GPUs, logging to :attr:`log_file`.

        Megatron's argument list stays in the ranks' output, which the demo keeps in :attr:`ranks_log`.
        """
        return replace(
            self.energy, optimise=True, backend="simulated", log_file=self.log_file, show_megatron_log=True
        )

    def command(self, master_port: int) -> list[str]:
        """The ``torch.distributed.run`` command line that runs the job through the energy launcher.

        Args:
            master_port: A free TCP port for the gloo rendezvous on this machine.
        """
        return [
            sys.executable, "-m", "torch.distributed.run",
            "--nnodes", "1", "--nproc-per-node", str(self.pipeline_size),
            "--master-addr", "127.0.0.1", "--master-port", str(master_port),
            "-m", "megatron_energy.launch", str(TRAINING_SCRIPT),
            *self.megatron_args(),
            *energy_argv(self.launcher_energy_config()),
        ]  # fmt: skip
