"""Reports: summary tables, frontier plots and Perfetto timelines of a job's profile and plan."""
