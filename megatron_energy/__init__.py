"""megatron_energy: energy optimisation plugins for Megatron-LM training.

Add ``--energy-optimise`` to a Megatron pretrain command (through ``python -m megatron_energy.launch`` or
the patch set in ``patches/``) and the training job profiles, plans and applies per-instruction GPU clocks
that cut energy at the same iteration time. See README.md.

Layers (imports only run down; ``tests/test_layering.py`` checks every import, that no modules import each
other in a cycle, that no two modules share a name and no type is defined twice, and that nothing below the
command layer imports a concrete optimiser):

6. ``demo_model/``'s modules: the demo's training job, a Megatron training script the launcher runs;
   nothing in the package imports them.

5. what a user calls: ``commands/``, ``report/``, ``launch`` (with ``launch_errors``, its one-line refusals,
   and ``launch_output``, its ranks' whole-line output with Megatron's argument list set aside), ``cli``.
4. ``megatron/``: the only room that imports ``megatron.*``: hooks, executed pipeline orders, refused modes,
   patches.
3. ``runtime/``: the session, a thin dispatcher of Megatron's schedule events over one explicit phase,
   and its rooms: ``profiling/``, ``planning_round/`` (cache, planner process, one decision every rank
   takes), ``running/`` (plan runner, phase switcher, run guard), ``energy_log/``, with ``control_plane/``
   (the session's own collectives) shared by all; and ``dvfs/`` (GPU backends, controller, guard, lease,
   meter, power sampler, simulated GPUs; the only room importing zeus and pynvml).
2. ``optimisers/``: the interface (``optimisers.interface``), ``--energy-mode`` (``optimisers.registry``,
   ``optimisers.composition`` for ``all``) and the concrete optimisers ``optimisers/perseus/`` (clock per
   instruction), ``optimisers/kareus/`` (collectives) and ``optimisers/kernel/`` (clock per phase), each a
   leaf that only the registry (by name) and the command layer reach; beside them ``config/`` (the flags that
   choose them, each declared on its ``EnergyConfig`` field, and what each of their values may be),
   ``plan_outcome`` (why a plan saves nothing), ``job`` (the job description the offline commands plan
   and simulate), ``energy_dir`` (the ``--energy-dir``'s files and the job facts it is keyed by). Pure
   Python, no torch.
1. pure models: ``pipeline/`` (the job's description: instruction identity, orders, DAG, workload, profile,
   its collectives and their levers, its kernels' phase timelines), ``sim/`` (the simulator, each GPU's
   modelled power over an iteration, the whole job's power at scale, the power floor and the filler a smooth
   bound needs), ``plan`` (Plan v3, the one executable contract; ``plan_smoothing``: a smooth plan's filler),
   ``target`` (``--energy-target`` and its one deadline rule; ``smooth_bound``: the bound of ``smooth:``),
   ``dvfs.model``
   and the calibration's pure side (``dvfs.calibration``, its fit ``dvfs.calibration_fit`` and the spec it
   makes, ``dvfs.calibrated_spec``).
0. foundations: ``errors`` (the root :class:`~megatron_energy.errors.EnergyError`), ``log`` (the
   ``megatron_energy`` logger every module's logger sits under, its console handler and rank filter),
   ``atomic``, ``events``,
   ``stats``, ``power_swing`` (power over time; the swing, ramps and band energy grid operators bound),
   ``plugin_threads`` (the plugin's background threads and their CPU time), ``dvfs.spec``,
   ``dvfs.kernel_classes`` (the kernel classes and the class mix of a piece of work) and ``dvfs.clock_switch``
   (the switch-latency rule the simulator, the phase optimiser and the simulated GPU share).
"""

__version__ = "0.1.0"
