"""Room 4, the energy log: what each step cost, measured next to predicted, and what the plugin itself cost.

``energy_logger`` (one rank's part of the log line, its scalars and records), ``energy_line``, ``log_window``
and ``log_aggregate`` (the line, its window and its job-wide figures), ``meter_thread`` (the counter read off
the training thread), ``stock_check`` (model vs measured at stock clocks), ``host_cost`` and
``overhead_check`` (the plugin's own cost), ``power_cap_record`` (the power-cap check's record beside the
iteration records), ``power_log`` (the GPU's sampled power at each log interval: ``power_interval`` its
figures, ``iteration_swings`` each iteration's swing, ``power_record`` its record and scalars,
``power_trace_file`` the raw trace).
"""
