"""hsdump: EAGLE-3 hidden states from an in-process SGLang engine into sharded safetensors."""

__version__ = "0.1.0"
