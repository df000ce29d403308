"""Room 3, running the plan: clocks at hook events and inside instructions, and the policies that guard it.

``run_guard`` (the straggler exchange and the safety net, step by step), ``plan_runner`` (a rank's actions at
its hooks), ``phase_switcher`` and ``simulated_phases`` (clocks inside instructions on GPUs and on simulated
GPUs), ``policies`` (straggler policy, safety net), ``power_watch`` (a power budget's allowance),
``collective_points`` and ``communicator_budgets`` (the collectives a plan retimes and resizes).
"""
