"""Room 1, profiling: the grid of clocks walked step by step, the stock baseline, the kernel timelines.

``collector`` (the steps' plan and the profile rows), ``baseline_length`` and ``stock_baseline`` (how many
stock steps, and what every measured change is set against), ``job_stock`` and ``replica_profile`` (what one
replica's ranks send rank 0, with fixed-size checks of every other rank), ``kernel_timeline`` (the phases
inside instructions), ``torch_recorder`` and ``recorded_step`` (the recorded step's profiler, and what it
cost the host), ``extrapolation`` (clocks a dry run cannot set), ``measured_inputs`` (the rest of what a
plan is made from), ``power_cap_watch`` and ``power_cap_check`` (the clock of instructions held at the power
cap, read at the stock clock, against the model's).
"""
