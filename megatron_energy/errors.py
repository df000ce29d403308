"""The root of every error megatron_energy raises on purpose.

Each error says what is wrong and what to do about it. Catching :class:`EnergyError` catches every one of
them (a plan file that cannot be used, a job config, a profiling grid that does not fit the GPU, ...),
while programming errors stay ordinary Python exceptions. Subclasses also derive from the builtin that
describes them (``ValueError`` for bad input), so existing ``except ValueError`` handlers keep working.
"""


class EnergyError(Exception):
    """Something megatron_energy cannot do as asked; the message says why and what to do."""


class EnergyValueError(EnergyError, ValueError):
    """Bad input (a flag, a file, a job description); the message names it and the fix."""


class TargetUnreachableError(EnergyValueError):
    """No plan meets the target, though the job's profile is sound; the message names what can be reached.

    For example a power budget below the lowest reachable power: the profile is worth keeping for another
    target.
    """


class UnknownModeError(EnergyValueError):
    """``--energy-mode`` names no released optimiser."""


class EnergyRuntimeError(EnergyError, RuntimeError):
    """The environment refuses (a GPU, a Megatron mode, a source tree); the message says what to do."""
