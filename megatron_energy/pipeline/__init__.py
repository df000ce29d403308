"""The pipeline-parallel iteration as data: instruction identity, executed orders, DAG and workload.

Layer 1: pure Python + numpy/networkx; no torch, no megatron, no NVML.
"""
