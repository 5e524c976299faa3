"""The dataset commands: verify, inspect, export, vocab, preview (each a `main(argv) -> int`)."""
