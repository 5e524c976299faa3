"""Reference computations shared by the tests: transformers forward passes."""

import torch


def hf_hidden_states(model_path: str, input_ids, dtype=torch.float32):
    """transformers' output_hidden_states tuple for one sequence: L + 1 tensors [seq, H]."""
    from transformers import AutoModelForCausalLM

    model = _model(model_path, dtype)
    with torch.no_grad():
        out = model(torch.tensor([list(input_ids)]), output_hidden_states=True)
    return [h[0].float() for h in out.hidden_states]


_cache = {}


def _model(path, dtype):
    from transformers import AutoModelForCausalLM

    key = (path, dtype)
    if key not in _cache:
        _cache[key] = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    return _cache[key]


def rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a.float() - ref).norm() / ref.norm())


def committed(path) -> dict:
    """{sample id: shard name} as the dataset's commit records say ({} before the first)."""
    from hsdump import commits

    try:
        return commits.load(path).samples
    except FileNotFoundError:
        return {}


def skipped(path) -> dict:
    from hsdump import commits

    return commits.load(path).skipped


def shards(path) -> dict:
    """{shard name: record} of the committed shards."""
    from hsdump import commits

    try:
        return commits.load(path).shards
    except FileNotFoundError:
        return {}


def load_bench(name: str):
    """bench/<name>.py as a module (the GPU tests drive the bench scripts' checks)."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench" / f"{name}.py"
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(f"hsdump_bench_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod
