"""What the tests share: constants, sample and dataset factories, configs, commit-record views
and transformers reference forwards. Tests import from here (and from tests/tolerance.py for
the fidelity rules); no test imports another test module or conftest.py (whose fixtures stay
fixtures). torch and hsdump are imported inside the functions, so importing this module
stays light (conftest.py, tests/hostile.py's driver)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
"""The repository: extract.py, conf/, bench/."""

# the small synthetic datasets' shape: hidden size 8, captured layers [2, 4, 5]
H = 8
LAYERS = [2, 4, 5]
COMPAT = {"model": "m", "layers": LAYERS, "storage_dtype": "bfloat16"}


def rows_manifest(layers=LAYERS, hidden_size=H, model="m", **kw):
    """The Manifest of the small synthetic datasets (hsdump.store.manifest.Manifest.for_rows):
    model `m`, 8 layers; keyword arguments as for_rows's (storage_dtype, final, planned...)."""
    from hsdump.store.manifest import Manifest

    return Manifest.for_rows(
        model=model, hidden_size=hidden_size, num_hidden_layers=8, layers=layers, **kw
    )


def patch_manifest(path, **keys) -> dict:
    """Set top-level keys of dataset `path`'s manifest.json (a test's damaged or hand-made
    manifest); returns the new object."""
    p = Path(path) / "manifest.json"
    m = {**json.loads(p.read_text()), **keys}
    p.write_text(json.dumps(m))
    return m


# extract.py / `hsdump ray` overrides of the multi-job tests (test_launch.py, test_ray.py); one
# writer thread: shards reach the fault points in order, so "killed at its 2nd shard" means
# exactly one listed shard (with several threads the kill may land before the 1st's index)
JOB_ARGS = [
    "dataset.max_samples=20",
    "dataset.max_seq_len=64",
    "output.shard_bytes=40000",
    "progress=false",
    "dataset.on_bad_row=skip",
    "output.writer_threads=1",
]


# --------------------------------------------------------------------------- samples
def stored_sample(sid, n, final=()):
    """Sample `sid` of `n` tokens as a dataset stores it: (input_ids, loss_mask, hidden
    states per LAYERS, {final kind: tensor}), tensors, random but fixed by `sid`."""
    import torch

    g = torch.Generator().manual_seed(sid)
    ids = torch.randint(0, 100, (n,), generator=g)
    mask = torch.tensor([0] * (n // 2) + [1] * (n - n // 2))
    hs = [torch.randn(n, H, generator=g) for _ in LAYERS]
    fin = {k: torch.randn(n, H, generator=g) for k in final}
    return ids, mask, hs, fin


def sample(sid, n):
    """The same sample as `stored_sample` as DatasetWriter.add takes it: (input_ids list,
    loss_mask list, hidden states)."""
    ids, mask, hs, _ = stored_sample(sid, n)
    return ids.tolist(), mask.tolist(), hs


def make_dataset(
    path, samples, *, storage="bfloat16", per_shard=3, skipped=None, skipped_rows=None, model="m"
):
    """Write a dataset the way hsdump's writer lays it out (format.md), plus the two format
    extensions read here: fp8 hidden states (`.../scale` companions) and final-layer states
    (`{i}/final/{pre_norm,post_norm}`). `samples`: {sid: stored_sample(...)}."""
    import torch
    from safetensors.torch import save

    from hsdump.store import fp8

    path.mkdir(parents=True, exist_ok=True)
    index = {
        "format": "hsdump/speculators-v1",
        "format_version": 1,
        "samples": {},
        "shards": {},
        "skipped": skipped or {},
    }
    sids = sorted(samples)
    for s in range(0, len(sids), per_shard):
        tensors = {}
        for sid in sids[s : s + per_shard]:
            ids, mask, hs, fin = samples[sid]
            tensors[f"{sid}/input_ids"] = torch.as_tensor(ids, dtype=torch.int64)
            tensors[f"{sid}/loss_mask"] = torch.as_tensor(mask, dtype=torch.int64)
            named = {f"{sid}/hidden_states/{j}": h for j, h in enumerate(hs)}
            named.update({f"{sid}/final/{k}": v for k, v in fin.items()})
            for name, h in named.items():
                if storage == "fp8":
                    tensors.update(fp8.encode(name, h))
                else:
                    tensors[name] = h.to(torch.bfloat16).contiguous()
        meta = {
            "format": "hsdump/speculators-v1",
            "format_version": "1",
            "layers": json.dumps(LAYERS),
        }
        if storage == "fp8":
            meta.update(fp8.shard_metadata())
        data = save(tensors, metadata=meta)
        name = f"shard-{s // per_shard:05d}.safetensors"
        (path / name).write_bytes(data)
        index["shards"][name] = {
            "bytes": len(data),
            "samples": len(sids[s : s + per_shard]),
            "sha256": hashlib.sha256(data).hexdigest(),
        }
        for sid in sids[s : s + per_shard]:
            index["samples"][str(sid)] = name
    manifest = {
        "format": "hsdump/speculators-v1",
        "format_version": 1,
        "layers": LAYERS,
        "storage_dtype": "float8_e4m3fn" if storage == "fp8" else storage,
        "model": {"path": model, "hidden_size": H, "num_hidden_layers": 6, "dtype": "bfloat16"},
        "dataset": {"path": "d", "rows": 20, "skipped_rows": skipped_rows or {}},
    }
    (path / "manifest.json").write_text(json.dumps(manifest))
    (path / "index.json").write_text(json.dumps(index))
    return path


def mask_runs(ids, mask):
    """The runs of consecutive loss-masked token ids: one list per assistant turn."""
    out, cur = [], []
    for t, m in zip(ids, mask):
        if m:
            cur.append(t)
        elif cur:
            out.append(cur)
            cur = []
    if cur:
        out.append(cur)
    return out


# --------------------------------------------------------------------------- configs
def cpu_engine_config(**over):
    """The engine settings of conf/engine/cpu.yaml, as the dataclass (fields of `over` replacing)."""
    from hsdump.capture.start import engine_preset

    return engine_preset("cpu", **over)


def compose_config(*overrides, hydra=False):
    """conf/config.yaml composed with `overrides` by Hydra (with its hydra node if `hydra`)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=hydra)


# --------------------------------------------------------------------------- commit records
def committed(path) -> dict:
    """{sample id: shard name} as the dataset's commit records say ({} before the first)."""
    from hsdump.store import commits

    try:
        return commits.load(path).samples
    except FileNotFoundError:
        return {}


def skipped(path) -> dict:
    from hsdump.store import commits

    return commits.load(path).skipped


def shards(path) -> dict:
    """{shard name: record} of the committed shards."""
    from hsdump.store import commits

    try:
        return commits.load(path).shards
    except FileNotFoundError:
        return {}


def shard_mtimes(out, names=None) -> dict:
    """{shard name: st_mtime_ns} of `names` (default: the committed shards)."""
    return {
        n: (Path(out) / n).stat().st_mtime_ns for n in (shards(out) if names is None else names)
    }


# --------------------------------------------------------------------------- references
def hf_hidden_states(model_path: str, input_ids, dtype=None):
    """transformers' output_hidden_states tuple for one sequence: L + 1 tensors [seq, H]
    (`dtype`: the model's, default float32), by hsdump.check's reference forward."""
    import torch

    from hsdump.check import forward

    model = hf_model(model_path, torch.float32 if dtype is None else dtype)
    return forward(model, input_ids, "cpu").hidden_states


_cache = {}


def hf_model(path, dtype):
    """The checkpoint's transformers model (hsdump.check.reference_model) in `dtype`, loaded
    once per process."""
    from hsdump.check import reference_model

    key = (path, dtype)
    if key not in _cache:
        _cache[key] = reference_model(path, dtype)
    return _cache[key]


def byte_bpe(vocab_size: int, special_tokens: list):
    """A byte-level BPE of `vocab_size` tokens trained on a fixed synthetic text, the special
    tokens first (ids 0, 1, ...): a small tokenizer of the real kind (`tokenizers.Tokenizer`)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    t = Tokenizer(models.BPE(unk_token=None))
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    words = [f"word{i} reply{i % 97} the quick brown fox {i * 7}" for i in range(3000)]
    t.train_from_iterator(
        words,
        trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=special_tokens,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    return t
