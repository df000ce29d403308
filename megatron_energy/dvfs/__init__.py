"""GPU frequency control, energy metering and the time/power-vs-clock model.

This package's ``__init__`` stays import-light: it imports nothing, so ``dvfs.spec`` and ``dvfs.model`` (pure
Python) can be used without zeus, pynvml or torch installed. Backend modules import those lazily.
"""
