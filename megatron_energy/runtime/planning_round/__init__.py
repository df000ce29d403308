"""Room 2, the planning round: from the profile to one decision every rank takes at the same step.

``coordinator`` (the round itself: cache first, gather, the planner process, poll, broadcast, adopt or
fall back), ``planner_input`` (what the planner plans from), ``adoption`` (every rank adopts the plan, or
none), ``planning`` (profile rows to a plan release on rank 0), ``planner_process`` (the planner in a
process of its own), ``replanning`` (the job an optimiser plans), ``cache`` and ``cache_manifest`` (the
verified ``--energy-dir`` cache).
"""
