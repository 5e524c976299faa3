"""Tiny random checkpoints for hsdump's tests and benchmarks: every model family's
(`hsdump.testing.families`) and the shapes the GPU tests and benchmarks run
(`hsdump.testing.models`). Built with transformers' own classes and cached; nothing here is
needed to run hsdump on a real model, and the wheel leaves this package out (a checkout's
tests and benchmarks import it)."""
