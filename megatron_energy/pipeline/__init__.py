"""The pipeline-parallel iteration as data: one instruction identity, executed orders, the DAG and the workload.

Layer 1: pure Python + numpy/networkx; no torch, no megatron, no NVML.
"""
