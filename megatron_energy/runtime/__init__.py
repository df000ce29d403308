"""The per-rank runtime behind ``EnergySession``: a thin event dispatcher and the rooms it dispatches to.

``session`` (``EnergySession``, the ``ScheduleListener`` Megatron's hooks call) dispatches the step events
over one explicit phase (``session_phase``) and hands the instruction and outside-phase events to
``instruction_events`` (the marks on the timeline, and the plan's clocks requested at them);
``session_state`` is what the rooms share (phase, plan, runner, baseline; it tells each
``parts.PlanFollower``, such as the collective runner, which plan point runs). The rooms follow the data:

1. **Profiling** (``runtime.profiling``): the controller holds each clock of a grid for a settling step and
   a few measured steps, the stock clock first (``profiling.collector``); the timer times every instruction
   on the device timeline and the whole iteration; the meter gives each step's energy. The stock clock's
   **baseline steps**, as many as ``profiling.baseline_length`` asks (every rank agrees on the count), are
   timed exactly as the run phase times its steps (lagged, no device sync) and are the stock baseline every
   measured change is compared with; the **synchronous profile steps** wait for the device at their begin
   and end, so the counter laps separate the pipeline span's energy from what ran between two schedules
   (``runtime.step_figures``): they give the profile rows and the measured iteration tail; at the stock
   clock, the planning replica also reads the SM clock and its power-cap reason at their instruction ends,
   and at profiling's end rank 0 sets the clock of those held at the cap against the model's
   (``runtime.profiling.power_cap_watch``, ``runtime.profiling.power_cap_check``,
   ``runtime.profiling.power_cap_report``).
2. **The planning round** (``runtime.planning_round.coordinator.PlanningRound``): a verified cached plan at
   the start, else, at profiling's end, the planning replica's profiles on rank 0, the planner in a process
   of its own, polled every K steps while training goes on at stock clocks (real GPUs) or waited for
   (simulated GPUs), and one decision every rank takes at the same step: adopt the plan, or fall back.
3. **Running the plan** (``runtime.running``): a ``running.plan_runner.PlanRunner`` applies this rank's
   actions at hook events (an instruction's clock at its boundary on the GPU timeline, a tail phase's at its
   outside-phase hook); the clocks of phases inside an instruction go to a phase switcher anchored on the
   instruction's start marker (``running.phase_switcher``; ``running.simulated_phases`` on simulated GPUs);
   an error there turns phase switching off with a log line. A step replayed from a full-iteration CUDA graph
   runs no hook: the timer reads the markers captured in the graph, and every clock of the step goes to the
   phase switcher as an offset from the replay's start, measured on the previous replay
   (``running.graph_requests``). After each run-phase step the ``running.run_guard.RunGuard`` follows a
   straggling data-parallel replica and reverts to stock clocks when the plan is slow.
4. **The energy log** (``runtime.energy_log``): each step's energy and time next to the prediction, with its
   change against the stock baseline over a window of the phase's iterations; at close the plugin's own host
   time and model vs measured at stock clocks (``runtime.energy_log.closing_lines``).
Beside them: ``profiling/`` also holds the grid of clocks and kernel timelines; ``running/`` the collective
levers; ``energy_log/`` the log line's window and job-wide figures, the meter thread and the plugin's own
cost; ``control_plane/`` the session's collectives over the job's own groups (never world-size). Shared by
all: ``context`` (the rank's place in the job), ``parts`` (interfaces of the GPU-side parts, and the plan
followers' port), ``timing`` and ``cuda_timer`` (instruction times), ``step_figures``, ``child_process``, and
``assembly`` (builds a rank's session from the config).
"""
