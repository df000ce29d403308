"""The per-rank runtime behind ``EnergySession``: context, collectives, timing, profiling, cache."""
