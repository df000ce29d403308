"""Megatron-LM integration: the only package of megatron_energy that imports ``megatron.*``."""
