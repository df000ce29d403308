"""megatron_energy: energy optimisation plugins for Megatron-LM training.

Add ``--energy-optimise`` to a Megatron pretrain command (through ``python -m megatron_energy.launch`` or
the patch set in ``patches/``) and the training job profiles, plans and applies per-instruction GPU clocks
that cut energy at the same iteration time. See README.md.
"""

__version__ = "0.1.0"
