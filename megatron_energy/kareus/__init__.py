"""Kareus-style optimiser: when each collective launches and on how many SMs (CTAs), jointly with the clock.

Layer 2 (with ``perseus/``): pure Python, no torch, megatron or NVML. :mod:`.collectives` is the naming
scheme shared with the runtime.
"""
