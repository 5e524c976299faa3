"""hsdump's capture against SpecForge 0.2.0's own offline capture of the same token ids.

SpecForge runs its own SGLang pin (0.5.14, torch 2.11.0) in a venv of its own
(`tools/reference/make-venv-sf514.sh` -> `.venv-sf514`); hsdump runs SGLang 0.5.23 in `.venv`.
Both capture the same token ids: hsdump's dataset gives them, SpecForge's capture is fed them,
so what differs is the capture alone (SpecForge's own tokenization and template are not part of
this comparison).

    python bench/reference_capture.py ids DATASET OUT.jsonl [--limit N]
    python bench/reference_capture.py specforge IDS.jsonl OUT --model M --layers 1,14,26 \
        [--python .venv-sf514/bin/python] [--batch 8] [--device cpu|cuda] [--dtype bfloat16]
    python bench/reference_capture.py compare HSDUMP SPECFORGE_OUT [--dataset DS] \
        [--json OUT.json] [--md OUT.md]
    python bench/reference_capture.py run DATASET WORK [--python .venv-sf514/bin/python] \
        [--batch 8] [--device cpu|cuda] [--hf N] [--json OUT.json]    # all of the above
    python bench/reference_capture.py speed WORK [--shape llama8b] [--samples 512] \
        [--tokens 2048] [--batch 32] [--python ...] [--json OUT.json]  # SpecForge's speed

- `ids`: each sample's `input_ids` and `loss_mask` read with hsdump's reader, in hsdump id order
  (the order `hsdump export` numbers its files in), one JSON object a line: `{id, input_ids,
  loss_mask}`. It prints the model folder and the EAGLE-3 SGLang ids the manifest records.
- `specforge`: runs `bench/reference_specforge_worker.py` in SpecForge's interpreter
  (`--python`), which captures with SpecForge's offline API at the given SGLang layer ids and
  writes SpecForge's EAGLE-3 records (`rows_{g}-{g+2000}/data_{i}.ckpt`: `input_ids`,
  `loss_mask`, `aux_hidden_state` `[1, T, K*H]`, `hidden_state` `[1, T, H]`, T the padded batch
  length, as SpecForge writes them) and `reference_capture.json` (positions -> ids, timing). On
  the CPU it first builds hsdump's libcuda stub (`hsdump.capture.patch.load_libcuda_stub`: SGLang's
  CUDA kernel package needs `libcuda.so.1` to import) and passes it to the worker through
  `LD_LIBRARY_PATH`, with `SPECFORGE_DEVICE=cpu` and `SGLANG_USE_CPU_ENGINE=1`.
- `compare`: HSDUMP is an hsdump dataset or its `--to specforge --kind eagle3` export (then the
  export's source dataset, when it is still there, or `--dataset`, gives the other captured
  layers and final states); SPECFORGE_OUT is the `specforge` step's folder, or another hsdump
  export (the fallback check of the comparison itself). Per sample and per tensor: relative
  error `||sf - hs||_F / ||sf||_F` over the rows both hold (SpecForge's is the reference), the
  same without row 0 (real activations put an attention sink there), the largest absolute
  difference, the first row's, the last real row's and the worst row's error, the error with
  SpecForge's rows shifted one row either way, and the hsdump tensor the SpecForge tensor is
  closest to among every captured layer and final state, over the rows after the first (a
  layer off by one, or pre- against post-norm, names itself there); whether ids and loss masks
  are equal on the real rows, how many pad rows SpecForge's record holds and what ids, mask
  and states it holds on them, and the loss rows SpecForge's EAGLE-3 normalizer leaves on each
  record. `--hf N`: each side's error against a float32 transformers forward of the first N
  samples (which side a difference comes from). A Markdown table and a JSON.
- `run`: export (hsdump's `--to specforge --kind eagle3`), ids, specforge and compare in one go,
  the model folder and layer ids taken from the dataset's manifest, under WORK.
- `speed`: SpecForge's capture alone on a benchmark shape (`llama8b`, SGLang's random weights,
  random ids, batch 32, its EAGLE-3 default layers), timed by the worker: tokens/s in steady
  state and over the whole run, bytes and files. hsdump's side on the same host is
  `bench/bench.py --models llama8b:2048:512:2 --modes a,b --weights dummy` (`run-0523.sh ref`
  runs both).

The comparison itself (loading both sides, the metrics, the table) is reference_compare.py beside
this file.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

from reference_compare import HsdumpSide, SpecForgeSide, compare, manifest_facts, table

ROOT = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().with_name("reference_specforge_worker.py")


# ----------------------------------------------------------------------------- ids
def write_ids(dataset: str, out: str, limit: Optional[int] = None) -> int:
    from hsdump.store.reader import HsdumpDataset

    ds = HsdumpDataset(dataset)
    ids = ds.ids if limit is None else ds.ids[:limit]
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w") as f:
        for sid in ids:
            rec = ds.get(sid, hidden=False)
            row = {
                "id": int(sid),
                "input_ids": rec["input_ids"].tolist(),
                "loss_mask": rec["loss_mask"].tolist(),
            }
            f.write(json.dumps(row) + "\n")
    ds.close()
    return len(ids)


def cmd_ids(a) -> int:
    n = write_ids(a.dataset, a.out, a.limit)
    facts = manifest_facts(a.dataset)
    print(f"{n} samples -> {a.out}")
    print(
        f"model {facts['model']}; EAGLE-3 layers {facts['eagle3_layers']} "
        f"(hf_hidden_states_index) = SGLang ids {facts['eagle3_serving_ids']}"
    )
    return 0


# ----------------------------------------------------------------------------- specforge
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_specforge(
    ids: str,
    out: str,
    *,
    model: str,
    layers: List[int],
    python: str,
    batch: int = 8,
    device: str = "cuda",
    dtype: str = "bfloat16",
    attention_backend: Optional[str] = None,
    limit: Optional[int] = None,
    log: Optional[str] = None,
    pythonpath: Optional[str] = None,
    load_format: Optional[str] = None,
    method: str = "eagle3",
    fsync: bool = False,
) -> int:
    from hsdump.tiny import resolve_model_path

    env = dict(os.environ)
    if device == "cpu":
        from hsdump.capture.patch import load_libcuda_stub

        load_libcuda_stub()  # sets LD_LIBRARY_PATH in os.environ when it builds the stub
        env = dict(os.environ)
        env["SPECFORGE_DEVICE"] = "cpu"
        env["SGLANG_USE_CPU_ENGINE"] = "1"
        attention_backend = attention_backend or "torch_native"
    env.update(
        RANK="0",
        WORLD_SIZE="1",
        LOCAL_RANK="0",
        LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
    )
    if pythonpath is not None:  # SpecForge's packages as a folder (a host without PyPI)
        env["PYTHONPATH"] = pythonpath
    cmd = [
        python,
        str(WORKER),
        ids,
        out,
        "--model",
        resolve_model_path(model),
        "--layers",
        ",".join(str(k) for k in layers),
        "--batch",
        str(batch),
        "--device",
        device,
        "--dtype",
        dtype,
    ]
    if attention_backend:
        cmd += ["--attention-backend", attention_backend]
    if limit is not None:
        cmd += ["--limit", str(limit)]
    if load_format:
        cmd += ["--load-format", load_format]
    if method != "eagle3":
        cmd += ["--method", method]
    if fsync:
        cmd += ["--fsync"]
    print("+", " ".join(cmd), flush=True)
    if log:
        with open(log, "w") as f:
            p = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT)
        if p.returncode:
            print(Path(log).read_text()[-6000:], file=sys.stderr)
        return p.returncode
    return subprocess.run(cmd, env=env).returncode


def cmd_specforge(a) -> int:
    layers = [int(x) for x in a.layers.split(",") if x.strip()]
    return run_specforge(
        a.ids,
        a.out,
        model=a.model,
        layers=layers,
        python=a.python,
        batch=a.batch,
        device=a.device,
        dtype=a.dtype,
        attention_backend=a.attention_backend,
        limit=a.limit,
        pythonpath=a.pythonpath,
        method=a.method,
    )


def cmd_speed(a) -> int:
    """SpecForge's capture alone on the benchmark shape: `--shape` from hsdump.testing.models
    (llama8b: Llama-3.1-8B's dimensions) with SGLang's random weights (`load_format=dummy`, the
    folder holds config.json only, as `bench/bench.py --weights dummy` runs hsdump's side),
    `--samples` rows of `--tokens` ids, the very ids bench.py times at that length
    (`models.bench_ids`; their digest is recorded), its EAGLE-3 default layers for the depth in
    SGLang ids, batch `--batch`, each record fsynced (`--no-fsync`: as SpecForge writes them);
    writes its records under WORK/records and prints the worker's timing (tokens/s steady and
    whole run, bytes, files). `bench/speed_pair.py` pairs its JSON with bench.py's."""
    from hsdump.capture.layers import eagle3_default
    from hsdump.testing import models, speed

    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    folder = models.build(
        a.shape, work / f"{a.shape}-dummy", weights="dummy", **models.BENCH_KW.get(a.shape, {})
    )
    cfg = json.loads((Path(folder) / "config.json").read_text())
    n_layers = int(cfg["num_hidden_layers"])
    hf_index = eagle3_default(n_layers)
    layers = [k - 1 for k in hf_index]  # transformers index -> Llama's SGLang id
    ids = work / "ids.jsonl"
    rows = models.bench_ids(a.samples, a.tokens, int(cfg["vocab_size"]))
    with open(ids, "w") as f:
        for i, r in enumerate(rows):
            f.write(json.dumps({"id": i, "input_ids": r, "loss_mask": [1] * len(r)}) + "\n")
    out = work / "records"
    shutil.rmtree(out, ignore_errors=True)  # a run's files are its own
    rc = run_specforge(
        str(ids),
        str(out),
        model=folder,
        layers=layers,
        python=a.python,
        batch=a.batch,
        device=a.device,
        dtype="bfloat16",
        attention_backend=a.attention_backend,
        log=str(work / "specforge-speed.log"),
        pythonpath=a.pythonpath,
        load_format="dummy",
        fsync=a.fsync,
    )
    if rc:
        return rc
    state = json.loads((out / "reference_capture.json").read_text())
    t = state["timing"]
    res = {
        "what": "SpecForge 0.2.0's own offline capture, speed",
        "shape": a.shape,
        "hf_hidden_states_index": hf_index,
        "sglang_layer_ids": layers,
        "ids_sha256": speed.ids_digest(rows),
        "versions": state.get("versions"),
        "server_args": state.get("server_args"),
        "host": speed.host_identity(),
        "gpu": state.get("gpu"),
        "timing": t,
    }
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
    print(
        f"SpecForge {a.shape}: {t['samples']} x {a.tokens} tokens, batch {a.batch}: "
        f"steady {t['tokens_per_s_steady'] or 0:,.0f} tok/s, whole run "
        f"{t['tokens_per_s_whole_run']:,.0f} tok/s, {t['bytes']:,} bytes in {t['files']} files"
        f"{', fsynced' if t.get('fsync') else ''}"
    )
    if not a.keep:  # the records are what was timed; their size is in the timing
        shutil.rmtree(out, ignore_errors=True)
    return 0


def cmd_compare(a) -> int:
    hs = HsdumpSide(a.hsdump, a.dataset)
    sf = SpecForgeSide(a.specforge)
    res = compare(hs, sf, a.limit, a.hf, a.model)
    md = table(res)
    print(md)
    if a.md:
        Path(a.md).write_text(md)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0


# ----------------------------------------------------------------------------- run
def _versions() -> dict:
    import importlib.metadata as md

    out = {}
    for name in ("hsdump", "sglang", "torch", "transformers", "safetensors"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = "absent"
    return out


def cmd_run(a) -> int:
    from hsdump.tools.export import export

    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    facts = manifest_facts(a.dataset)
    ex = Path(a.export) if a.export else work / f"hsdump-{a.kind}"
    steps: Dict[str, float] = {}
    if not a.export:
        t = time.perf_counter()
        export(a.dataset, str(ex), "specforge", kind=a.kind, progress=False, overwrite=True)
        steps["export_s"] = time.perf_counter() - t
    ids = work / "ids.jsonl"
    n = write_ids(a.dataset, str(ids), a.limit)
    # the kind's SGLang serving ids, as the export records them for this model class
    served = json.loads((ex / "hsdump_export.json").read_text()).get("serving_ids")
    layers = [int(x) for x in a.layers.split(",")] if a.layers else served
    if not layers:
        raise SystemExit(f"the export records no {a.kind} serving ids: pass --layers")
    sfo = work / f"specforge-{a.kind}" if a.kind != "eagle3" else work / "specforge"
    rc = 0
    if not a.skip_specforge:
        t = time.perf_counter()
        rc = run_specforge(
            str(ids),
            str(sfo),
            model=a.model or facts["model"],
            layers=layers,
            python=a.python,
            batch=a.batch,
            device=a.device,
            dtype=a.dtype or facts["dtype"] or "bfloat16",
            attention_backend=a.attention_backend,
            log=str(work / f"specforge-{a.kind}.log"),
            pythonpath=a.pythonpath,
            method=a.kind,
        )
        steps["specforge_s"] = time.perf_counter() - t
        if rc:
            print(f"SpecForge's capture failed (rc {rc}): {work / f'specforge-{a.kind}.log'}")
            return rc
    res = compare(
        HsdumpSide(str(ex), a.dataset), SpecForgeSide(str(sfo)), hf_samples=a.hf, hf_model=a.model
    )
    md = table(res)
    print(md)
    (work / "compare.md").write_text(md)
    sf_state = json.loads((sfo / "reference_capture.json").read_text())
    out = {
        "what": "hsdump's capture against SpecForge 0.2.0's own offline capture, same token ids",
        "kind": a.kind,
        "command": " ".join(sys.argv),
        "samples": n,
        "hsdump": {"dataset": a.dataset, "export": str(ex), **facts, "driver": _versions()},
        "specforge": {
            k: sf_state.get(k)
            for k in ("versions", "model", "sglang_layer_ids", "device", "dtype", "server_args")
        }
        | {"shim": sf_state.get("shim"), "timing": sf_state.get("timing")},
        "steps": steps,
        "compare": res,
    }
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    (work / "reference.json").write_text(json.dumps(out, indent=1) + "\n")
    return 0


# ----------------------------------------------------------------------------- main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("ids", help="token ids and loss masks of an hsdump dataset")
    p.add_argument("dataset")
    p.add_argument("out")
    p.add_argument("--limit", type=int)
    p.set_defaults(fn=cmd_ids)

    def sf_args(p):
        p.add_argument(
            "--python",
            default=str(ROOT / ".venv-sf514" / "bin" / "python"),
            help="SpecForge venv's interpreter (default: .venv-sf514/bin/python)",
        )
        p.add_argument("--batch", type=int, default=8)
        p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
        p.add_argument("--attention-backend")
        p.add_argument("--pythonpath", help="PYTHONPATH for the worker (default: inherited)")

    p = sub.add_parser("specforge", help="SpecForge's own capture of an ids file")
    p.add_argument("ids")
    p.add_argument("out")
    p.add_argument(
        "--method",
        default="eagle3",
        choices=["eagle3", "dflash", "dspark"],
        help="SpecForge's algorithm (its capture method and record layout)",
    )
    p.add_argument("--model", required=True)
    p.add_argument("--layers", required=True, help="SGLang ids, comma-separated")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--limit", type=int)
    sf_args(p)
    p.set_defaults(fn=cmd_specforge)

    p = sub.add_parser("compare", help="an hsdump dataset or export against SpecForge's records")
    p.add_argument("hsdump")
    p.add_argument("specforge")
    p.add_argument("--dataset", help="hsdump dataset for the other layers (export given)")
    p.add_argument("--limit", type=int)
    p.add_argument("--model", help="model folder for --hf (default: the dataset's)")
    p.add_argument("--hf", type=int, default=0, help="N: first N samples against transformers")
    p.add_argument("--json")
    p.add_argument("--md")
    p.set_defaults(fn=cmd_compare)

    p = sub.add_parser("speed", help="SpecForge's capture on the benchmark shape, timed")
    p.add_argument("work")
    p.add_argument("--shape", default="llama8b", help="hsdump.testing.models name")
    p.add_argument("--samples", type=int, default=512)
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--json")
    p.add_argument("--keep", action="store_true", help="keep the records written")
    p.add_argument(
        "--fsync",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="fsync each record and its folder inside the timed batch (hsdump's durability); "
        "--no-fsync: as SpecForge writes them",
    )
    sf_args(p)
    p.set_defaults(fn=cmd_speed, batch=32)  # SpecForge's preparation default batch

    p = sub.add_parser("run", help="export, ids, specforge, compare")
    p.add_argument(
        "--kind",
        default="eagle3",
        choices=["eagle3", "dflash", "dspark"],
        help="the drafter kind: hsdump's export --kind and SpecForge's capture method",
    )
    p.add_argument("dataset")
    p.add_argument("work")
    p.add_argument("--export", help="an existing --to specforge --kind eagle3 export")
    p.add_argument("--model", help="default: the manifest's resolved model path")
    p.add_argument("--layers", help="SGLang ids (default: the manifest's EAGLE-3 serving ids)")
    p.add_argument("--dtype", help="default: the manifest's model dtype")
    p.add_argument("--limit", type=int)
    p.add_argument("--skip-specforge", action="store_true", help="compare an earlier run")
    p.add_argument("--hf", type=int, default=0, help="N: first N samples against transformers")
    p.add_argument("--json")
    sf_args(p)
    p.set_defaults(fn=cmd_run)

    a = ap.parse_args(argv)
    return a.fn(a)


if __name__ == "__main__":
    raise SystemExit(main())
