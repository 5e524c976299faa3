"""hsdump: EAGLE-3 hidden states from an in-process SGLang engine into sharded safetensors."""

__version__ = "0.2.0"  # 0.2: format version 2 (commit logs), regeneration, the hsdump command
