"""Subcommands of ``megatron-energy``; each module defines ``register(subparsers)`` and ``run(args)``."""
