"""The ``--energy-*`` flags and the ``EnergyConfig`` they fill.

``add_energy_args`` has the signature of Megatron's ``extra_args_provider``: pass it to
``megatron.training.arguments.parse_args`` (or ``parse_and_validate_args``) and the flags become ordinary
Megatron arguments. Bad values (an unknown GPU spec, a clock or count out of range, an output folder that
cannot be written) and contradictory combinations are rejected while parsing, with a message that says what
to do instead. ``EnergyConfig.from_args`` turns the parsed namespace into the typed config the
rest of the package uses.

Its modules, each with one job: ``energy_config`` (``EnergyConfig``, each field declaring its flag, and the
config's rules), ``flag`` (what a flag declares: ``EnergyFlag``), ``checks`` (what each value may be),
``values`` (reading values from text) and ``command_line`` (the flags on a parser, and the rules of a command
line).
"""

from megatron_energy.config.command_line import (
    EnergyArgumentParser,
    add_energy_args,
    command_line_problem,
    energy_argv,
    unwritable_folder_reason,
)
from megatron_energy.config.energy_config import (
    BACKENDS,
    ENERGY_FLAGS,
    MEMORY_CLOCK,
    PHASE_SWITCHING,
    PLANNING,
    Backend,
    EnergyConfig,
    EnergyConfigError,
    MemoryClockChoice,
    PhaseSwitchingChoice,
    Planning,
)
from megatron_energy.config.flag import EnergyFlag
from megatron_energy.config.values import known_gpu_spec, parse_freq_grid, positive_int
from megatron_energy.target import EnergyTarget

__all__ = [
    "BACKENDS",
    "ENERGY_FLAGS",
    "MEMORY_CLOCK",
    "PHASE_SWITCHING",
    "PLANNING",
    "Backend",
    "EnergyArgumentParser",
    "EnergyConfig",
    "EnergyConfigError",
    "EnergyFlag",
    "EnergyTarget",
    "MemoryClockChoice",
    "PhaseSwitchingChoice",
    "Planning",
    "add_energy_args",
    "command_line_problem",
    "energy_argv",
    "known_gpu_spec",
    "parse_freq_grid",
    "positive_int",
    "unwritable_folder_reason",
]
