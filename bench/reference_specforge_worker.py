"""SpecForge 0.2.0's own offline capture of given token ids: the reference side of
`bench/reference_capture.py` (its `specforge` subcommand runs this file in SpecForge's venv,
`tools/reference/make-venv-sf514.sh`: SpecForge 0.2.0, SGLang 0.5.14, torch 2.11.0). It imports
only the wheels of that venv (specforge, sglang, torch), never hsdump.

    python bench/reference_specforge_worker.py IDS.jsonl OUT --model M --layers 1,14,26 \
        [--batch 8] [--device cuda|cpu] [--dtype bfloat16] [--attention-backend B] \
        [--load-format dummy]

What it runs, all of it SpecForge's wheel API as its offline preparation uses it:

- `specforge.distributed.init_distributed(timeout=10, tp_size=1)` (one rank; the caller sets
  RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, and SPECFORGE_DEVICE=cpu on the CPU);
- `specforge.offline_capture.load_offline_capture(model, torch_dtype=..., **ServerArgs kwargs)`,
  which builds SGLang's ModelRunner itself with CUDA graphs and chunked prefill off; the kwargs
  are SpecForge's own defaults for its preparation command (`max_running_requests` = batch,
  `max_total_tokens` = batch x the longest padded row, radix cache on, the attention backend
  given) plus, on the CPU, `device="cpu"`, `sampling_backend="pytorch"` and
  `mem_fraction_static=0.3` (hsdump's CPU engine setting: SGLang's default resolves below zero
  on the CPU and refuses to build the KV cache);
- `.set_capture_layers(layers, capture_method=...)`: SGLang's ids (Llama adds 1 to each), the
  capture method of `--method`'s algorithm (eagle3, dflash or dspark: SGLang's setter of that
  kind);
- batches of `--batch` consecutive samples padded by SpecForge's own collator
  (`specforge.data.utils.DataCollatorWithPadding`: right padding with id 0, loss mask 0,
  attention mask 0), then `.capture(input_ids=, attention_mask=, loss_mask=)`;
- each sample's record built by the EAGLE-3 algorithm's own offline layout (the registry's
  `OfflineCaptureLayout`: `input_ids`, `loss_mask`, `aux_hidden_state` `[1, T, K*H]`,
  `hidden_state` `[1, T, H]`), written with `torch.save` to `OUT/rows_{g}-{g+2000}/data_{i}.ckpt`
  as SpecForge's preparation writes it (T is the batch's padded length: the rows SpecForge
  computes on its pad tokens are kept, as its own files keep them); with `--fsync` each file
  and its folder are fsynced inside the timed batch (SpecForge itself does not: the flag gives
  a speed comparison with hsdump, which fsyncs its shards, the same durability).

The shim, CPU only: `OfflineSGLangCaptureBackend.build` passes `gpu_id=torch.cuda.current_device()`
to SGLang's ModelRunner. On a machine without a GPU that call raises (torch 2.11.0: `RuntimeError:
Found no NVIDIA driver on your system`), so for
the duration of `load_offline_capture` alone `torch.cuda.current_device` is replaced by a
function returning 0 (the CPU runner's `gpu_id`; SpecForge's own `_bind_local_device` returns 0
for the CPU too). Nothing else of SpecForge or SGLang is changed. On a GPU nothing is shimmed.

`OUT/reference_capture.json`: positions -> hsdump sample ids, layers, versions, and the timing
(`tokens` real and padded, `seconds_whole_run` from process start to the last file,
`seconds_load`, `seconds_capture` over all batches, `seconds_steady` and `tokens_steady` over
batches after the first, `bytes`, `files`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from pathlib import Path

T0 = time.perf_counter()
GROUP = 2000


def _versions() -> dict:
    import importlib.metadata as md

    out = {}
    for name in ("specforge", "sglang", "sglang-kernel", "torch", "transformers"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = "absent"
    return out


@contextlib.contextmanager
def _cpu_current_device(device: str):
    """See the module docstring: `torch.cuda.current_device()` -> 0 while SpecForge builds
    its ModelRunner on the CPU."""
    import torch

    if device != "cpu":
        yield
        return
    saved = torch.cuda.current_device
    torch.cuda.current_device = lambda: 0
    try:
        yield
    finally:
        torch.cuda.current_device = saved


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _layout(method: str = "eagle3"):
    """The algorithm's own offline capture layout (text), from SpecForge's registry: EAGLE-3's
    records hold `aux_hidden_state` and `hidden_state`, DFlash's `hidden_states` [T, K*H],
    DSpark's that and `target_last_hidden_states`."""
    from specforge.algorithms.builtin import builtin_algorithm_registry

    providers = builtin_algorithm_registry().resolve(method).providers
    (text,) = [p for p in providers.offline if p.modality == "text"]
    return text.capture_layout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("ids", help="JSONL of {id, input_ids, loss_mask} (reference_capture.py ids)")
    ap.add_argument("out")
    ap.add_argument("--model", required=True)
    ap.add_argument("--layers", required=True, help="SGLang ids, comma-separated")
    ap.add_argument(
        "--method",
        default="eagle3",
        choices=["eagle3", "dflash", "dspark"],
        help="SpecForge's algorithm: its capture method and its record layout",
    )
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--attention-backend", default=None)
    ap.add_argument("--mem-fraction-static", type=float, default=None)
    ap.add_argument("--limit", type=int, default=None, help="first N samples only")
    ap.add_argument(
        "--load-format", default=None, help="dummy: SGLang fills random weights (config.json only)"
    )
    ap.add_argument(
        "--fsync",
        action="store_true",
        help="fsync each record after SpecForge's torch.save, and its folder, inside the timed "
        "batch (hsdump's writer fsyncs its shards: the same durability for a speed comparison)",
    )
    a = ap.parse_args()

    import torch
    from specforge.data.utils import DataCollatorWithPadding
    from specforge.distributed import destroy_distributed, init_distributed
    from specforge.offline_capture import load_offline_capture

    rows = [json.loads(line) for line in Path(a.ids).read_text().splitlines() if line.strip()]
    if a.limit is not None:
        rows = rows[: a.limit]
    layers = [int(x) for x in a.layers.split(",") if x.strip()]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    longest = max(len(r["input_ids"]) for r in rows)

    init_distributed(timeout=10, tp_size=1)
    kwargs = {
        "device": a.device,
        "max_running_requests": a.batch,
        "max_total_tokens": a.batch * longest,
        "disable_radix_cache": False,
    }
    if a.attention_backend:
        kwargs["attention_backend"] = a.attention_backend
    if a.mem_fraction_static is not None:
        kwargs["mem_fraction_static"] = a.mem_fraction_static
    if a.load_format:
        kwargs["load_format"] = a.load_format
    if a.device == "cpu":
        kwargs["sampling_backend"] = "pytorch"
        # SGLang's default resolves below zero on the CPU ("no GPU memory for the KV cache")
        kwargs.setdefault("mem_fraction_static", 0.3)
    t_load = time.perf_counter()
    with _cpu_current_device(a.device):
        capture = load_offline_capture(a.model, torch_dtype=getattr(torch, a.dtype), **kwargs)
    layout = _layout(a.method)
    capture.set_capture_layers(layers, capture_method=layout.capture_method)
    seconds_load = time.perf_counter() - t_load
    collate = DataCollatorWithPadding()

    dev = torch.device(a.device)
    batches, written, nbytes = [], 0, 0
    for start in range(0, len(rows), a.batch):
        chunk = rows[start : start + a.batch]
        feats = []
        for r in chunk:
            ids = torch.tensor(r["input_ids"], dtype=torch.long)[None, :]
            feats.append(
                {
                    "input_ids": ids,
                    "attention_mask": torch.ones_like(ids),
                    "loss_mask": torch.tensor(r["loss_mask"], dtype=torch.long)[None, :],
                }
            )
        batch = collate(feats)
        if a.device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        got = capture.capture(
            input_ids=batch["input_ids"].to(dev),
            attention_mask=batch["attention_mask"].to(dev),
            loss_mask=batch["loss_mask"].to(dev),
        )
        if a.device == "cuda":
            torch.cuda.synchronize()
        t_fwd = time.perf_counter() - t
        for j in range(len(chunk)):
            i = start + j
            rec = layout.materialize(
                {
                    "input_ids": batch["input_ids"][j].clone(),
                    "loss_mask": batch["loss_mask"][j].clone(),
                    "aux_hidden_states": got.hidden_states[j].cpu().clone().unsqueeze(0),
                    "last_hidden_states": got.last_hidden_states[j].cpu().clone().unsqueeze(0),
                }
            )
            g = i - i % GROUP
            path = out / f"rows_{g}-{g + GROUP}" / f"data_{i}.ckpt"
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save(rec, path)
            if a.fsync:
                _fsync(path)
            nbytes += path.stat().st_size
            written += 1
        if a.fsync:  # the new names in their groups' folders
            for d in sorted({out / f"rows_{i - i % GROUP}-{i - i % GROUP + GROUP}"
                             for i in range(start, start + len(chunk))}):  # fmt: skip
                _fsync(d)
        batches.append(
            {
                "samples": len(chunk),
                "tokens": sum(len(r["input_ids"]) for r in chunk),
                "padded_tokens": int(batch["input_ids"].numel()),
                "seconds_capture": t_fwd,
                "seconds": time.perf_counter() - t,
            }
        )
        print(
            f"batch {len(batches)}: {len(chunk)} samples, {batches[-1]['tokens']} tokens "
            f"({batches[-1]['padded_tokens']} padded), capture {t_fwd:.2f} s, "
            f"with files {batches[-1]['seconds']:.2f} s",
            flush=True,
        )
    whole = time.perf_counter() - T0
    steady = batches[1:]
    tokens = sum(b["tokens"] for b in batches)
    timing = {
        "samples": written,
        "tokens": tokens,
        "padded_tokens": sum(b["padded_tokens"] for b in batches),
        "batch": a.batch,
        "seconds_whole_run": whole,
        "seconds_load": seconds_load,
        "seconds_capture": sum(b["seconds"] for b in batches),
        "seconds_forward": sum(b["seconds_capture"] for b in batches),
        "seconds_steady": sum(b["seconds"] for b in steady) if steady else None,
        "tokens_steady": sum(b["tokens"] for b in steady) if steady else None,
        "tokens_per_s_steady": (
            sum(b["tokens"] for b in steady) / sum(b["seconds"] for b in steady) if steady else None
        ),
        "tokens_per_s_whole_run": tokens / whole,
        "bytes": nbytes,
        "files": written,
        "fsync": bool(a.fsync),
        "batches": batches,
    }
    state = {
        "tool": "bench/reference_specforge_worker.py",
        "ids_file": str(Path(a.ids).resolve()),
        "ids": [int(r["id"]) for r in rows],
        "model": a.model,
        "sglang_layer_ids": layers,
        "capture_method": layout.capture_method,
        "method": a.method,
        "device": a.device,
        "gpu": torch.cuda.get_device_name(0) if a.device == "cuda" else None,
        "dtype": a.dtype,
        "server_args": {k: v for k, v in kwargs.items()},
        "shim": "torch.cuda.current_device -> 0 during load_offline_capture"
        if a.device == "cpu"
        else None,
        "record_keys": list(layout.output_names),
        "versions": _versions(),
        "timing": timing,
    }
    (out / "reference_capture.json").write_text(json.dumps(state, indent=1) + "\n")
    print(json.dumps({k: v for k, v in timing.items() if k != "batches"}), flush=True)
    with contextlib.suppress(Exception):
        destroy_distributed()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
