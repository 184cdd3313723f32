"""Benchmarks for fwdtrain against the seed's stateful loop and a JAX implementation (not tests)."""
