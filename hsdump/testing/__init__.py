"""Tiny random checkpoints for hsdump's tests and benchmarks: every model family's
(`hsdump.testing.families`) and the shapes the GPU tests and benchmarks run
(`hsdump.testing.models`). Built with transformers' own classes and cached; nothing here is
needed to run hsdump on a real model (the wheel carries it, as every package of hsdump/: a
checkout's tests and benchmarks import it)."""
