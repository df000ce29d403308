"""The session's own collectives, shared by every room: never one that spans the world.

``comms`` (the few collectives, over the job's groups), ``gloo_groups`` (their CPU twins), ``group_chain``
(job-wide reductions and broadcasts as chains over the groups), ``staged_exchange`` and ``exchange_period``
(one link a step, one exchange every K steps).
"""
