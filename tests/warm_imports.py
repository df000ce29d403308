"""Imported once by the test session's forkserver (``zygote.world_context``): the modules every world needs.

Importing torch, megatron-core and megatron-core's training arguments takes seconds of CPU per process; the
forkserver pays it once and every world's zygote is forked from it with the modules already loaded. The CPU
shims are installed here too (a forked zygote installs them again, which is a no-op).
"""

from megatron_energy.demo_model.cpu_shims import install_cpu_shims, warnings_silenced

install_cpu_shims()
with warnings_silenced():
    import megatron.core.models.gpt
    import megatron.core.pipeline_parallel.schedules
    import megatron.training.arguments
    import megatron.training.global_vars  # noqa: F401

    import megatron_energy.dvfs.simulated
    import megatron_energy.launch
    import megatron_energy.megatron.hooks
    import megatron_energy.megatron.session_factory
    import megatron_energy.optimisers.perseus.clock_optimiser
    import megatron_energy.runtime.assembly  # noqa: F401
