"""Stage 2: the SGLang side. The only subpackage that imports sglang (engine, patch, serving); rows, layers, nodes and families are plain Python used on both sides."""
