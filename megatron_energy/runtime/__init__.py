"""The per-rank runtime behind ``EnergySession``: a thin event dispatcher and the rooms it dispatches to.

- ``session`` (``EnergySession``, the ``ScheduleListener`` Megatron's hooks call), ``session_phase`` (the one
  explicit phase) and ``session_state`` (what the rooms share: phase, plan, runner, baseline; it tells each
  ``parts.PlanFollower``, such as the collective runner, which plan point runs);
- ``profiling/``: the grid of clocks, the stock baseline, kernel timelines, one replica's profile;
- ``planning_round/``: cache, planner process, polling, one decision every rank takes together;
- ``running/``: the plan's clocks at hooks and inside instructions, the run guard (stragglers, safety net),
  collective levers;
- ``energy_log/``: the log line, its window and job-wide figures, the meter thread, the plugin's own cost;
- ``control_plane/``: the session's collectives over the job's own groups (never world-size);
- shared by all: ``context`` (the rank's place in the job), ``parts`` (interfaces of the GPU-side parts,
  and the plan followers' port), ``timing`` and ``cuda_timer`` (instruction times), ``step_figures``,
  ``child_process``, and ``assembly`` (builds a rank's session from the config).
"""
