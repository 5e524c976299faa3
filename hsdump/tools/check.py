"""`hsdump check OUT [--samples N] [--ids I,J] [--device D] [--model PATH] [--json]`: a dataset's
rows against transformers.

For a few samples (default 3, the first in id order) the checkpoint the manifest names is run
with transformers on the best device there is (cuda if available, else cpu), in float32 and
in bfloat16 (the same weights), and each captured layer and final state is compared with it by
hsdump.check's rules: per layer the error against float32, transformers' own bf16 error beside
it and the neighbour verdict (the rows are index k's, not k - 1's or k + 1's); per final state
its error and the next-token loss computed from it (post_norm: the LM head directly;
pre_norm: the final norm, then the head) against transformers'. Exit status: 0 every check
passed, 1 one failed (listed), 2 a dataset or model it cannot check (the message says why).

For a model too big for one device, the run itself can check its final states against SGLang's
own logprobs: `check.logprob_samples=N` (hsdump.check_final; docs/format.md, "Side files").
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import List, Optional

from hsdump.errors import MissingInput, Refusal
from hsdump.store.commits import read_manifest

DEFAULT_SAMPLES = 3


def model_path(manifest: dict, given: Optional[str]) -> str:
    """The checkpoint to run: `--model`, else the manifest's resolved path, else its path (a
    hub id, or a name hsdump builds: tiny:llama, smollm2:135m-instruct)."""
    if given:
        if not Path(given).is_dir():
            raise MissingInput(f"--model {given}: no such folder")
        return given
    m = manifest.get("model") if isinstance(manifest.get("model"), dict) else {}
    resolved, path = m.get("resolved_path"), m.get("path")
    if resolved and Path(resolved).is_dir():
        return str(resolved)
    if path and Path(path).is_dir():
        return str(path)
    if isinstance(path, str) and ":" in path and not path.startswith("/"):
        from hsdump.tiny import resolve_model_path

        return resolve_model_path(path)
    raise MissingInput(
        f"the dataset's model ({resolved or path}) is not a folder here: pass --model PATH, "
        "the checkpoint it was captured from"
    )


def pick(ds, samples: int, ids: Optional[List[int]]) -> List[int]:
    if ids:
        missing = [i for i in ids if i not in ds]
        if missing:
            raise Refusal(f"--ids: samples {missing} are not in {ds.path}")
        return ids
    if samples < 1:
        raise Refusal(f"--samples {samples}: give at least 1")
    if not ds.ids:
        raise Refusal(f"{ds.path} holds no samples yet: nothing to check")
    return list(ds.ids[:samples])


def best_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def check(
    out: str,
    samples: int = DEFAULT_SAMPLES,
    ids: Optional[List[int]] = None,
    device: Optional[str] = None,
    model: Optional[str] = None,
) -> dict:
    """The report of `hsdump check OUT` as a dict; "ok" is the verdict. Raises ValueError /
    FileNotFoundError for a dataset or model it cannot check."""
    manifest = read_manifest(Path(out))  # a folder that is no dataset: refused before torch
    if manifest.get("engine") == "dry":
        raise Refusal(
            f"{out} was written by engine=dry: its rows are a function of the token ids, not "
            "hidden states, so there is nothing to check against the model; extract again "
            "with a real engine"
        )
    path = model_path(manifest, model)
    from hsdump import check as c
    from hsdump.store.reader import HsdumpDataset

    device = device or best_device()
    ds = HsdumpDataset(out)
    try:
        sids = pick(ds, samples, ids)
        recs = [ds.get(i) for i in sids]
        layers, finals = list(ds.layers), list(ds.final_kinds)
    finally:
        ds.close()
    cfg = manifest.get("config") if isinstance(manifest.get("config"), dict) else {}
    trust = bool((cfg.get("model") or {}).get("trust_remote_code", False))
    prompts = [r["input_ids"].tolist() for r in recs]
    ref = c.reference(path, prompts, device, trust_remote_code=trust)
    lay = c.compare_layers(layers, recs, ref)
    fin = c.compare_finals(finals, recs, ref)
    return {
        "dataset": str(out),
        "model": path,
        "device": device,
        "samples": sids,
        "lengths": [len(p) for p in prompts],
        "moe": ref["moe"],
        "layers": [r.to_dict() for r in lay],
        "final": [r.to_dict() for r in fin],
        "ok": all(r.ok for r in lay + fin),
    }


def _worst(xs) -> str:
    xs = [x for x in xs if x is not None]
    return f"{max(xs):.4f}" if xs else "-"


def table(rep: dict) -> str:
    """The short table: one line per layer and final state, then each failure."""
    n, toks = len(rep["samples"]), sum(rep["lengths"])
    lines = [
        f"{rep['dataset']}: {n} samples (ids {', '.join(map(str, rep['samples']))}; {toks} "
        f"tokens) against transformers ({rep['model']}, {rep['device']})"
        + ("; mixture of experts: rule 2" if rep["moe"] else ""),
        f"{'':16s} {'err vs fp32':>11s} {'hf bf16':>8s}  {'neighbour / loss':40s} verdict",
    ]
    for r in rep["layers"]:
        lines.append(
            f"{'layer ' + str(r['index']):16s} {_worst(r['err']):>11s} {_worst(r['hf_bf16']):>8s}"
            f"  {r['neighbour']:40s} {'ok' if r['ok'] else 'FAIL'}"
        )
    for r in rep["final"]:
        loss = [x for x in r["loss"] if x is not None]
        ref32 = [x for x in r["loss_fp32"] if x is not None]
        ref16 = [x for x in r["loss_bf16"] if x is not None]
        mean = lambda xs: f"{sum(xs) / len(xs):.4f}" if xs else "-"  # noqa: E731
        what = f"loss {mean(loss)} (hf {mean(ref32)}, bf16 {mean(ref16)})"
        lines.append(
            f"{'final/' + r['kind']:16s} {_worst(r['err']):>11s} {_worst(r['hf_bf16']):>8s}"
            f"  {what:40s} {'ok' if r['ok'] else 'FAIL'}"
        )
    fails = [f for r in rep["layers"] + rep["final"] for f in r["failures"]]
    lines += [f"  {f}" for f in fails[:20]]
    if len(fails) > 20:
        lines.append(f"  ... {len(fails) - 20} more (--json lists all)")
    lines.append("ok" if rep["ok"] else f"FAILED: {len(fails)} checks")
    return "\n".join(lines)


def main(argv=None) -> int:
    from hsdump.command import prog

    p = argparse.ArgumentParser(
        prog=prog("check"),
        description="Compare a few samples' captured rows with transformers (float32, and its "
        "own bf16 error beside): per layer, the error and the neighbour verdict; per final "
        "state, the error and the next-token loss. Exit 0 ok, 1 a check failed, 2 cannot check.",
    )
    p.add_argument("out", help="the dataset folder (output.dir)")
    p.add_argument(
        "--samples", type=int, default=DEFAULT_SAMPLES, help="how many (the first in id order)"
    )
    p.add_argument("--ids", default=None, help="these sample ids instead (comma-separated)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    p.add_argument("--model", default=None, help="the checkpoint (default: the manifest's)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    a = p.parse_args(argv)
    try:
        ids = [int(x) for x in a.ids.split(",")] if a.ids else None
    except ValueError:
        p.error(f"--ids {a.ids!r}: give sample ids separated by commas, e.g. --ids 0,5,9")
    try:
        rep = check(a.out, a.samples, ids, a.device, a.model)
    except (Refusal, OSError) as e:  # a dataset or model it cannot check
        print(f"{prog('check')}: {e}", file=sys.stderr)
        return 2
    print(json.dumps(rep, indent=1) if a.json else table(rep))
    return 0 if rep["ok"] else 1
