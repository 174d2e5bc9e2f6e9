"""Spec-Bench-style benchmark: every method side by side with plain ``generate`` in one process."""

from .harness import run_bench
from .methods import METHODS, BenchContext, Method, register

__all__ = ["METHODS", "BenchContext", "Method", "register", "run_bench"]
