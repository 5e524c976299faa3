"""One extraction run: dataset -> tokens -> engine -> writer, with progress and a summary."""

from __future__ import annotations

import dataclasses
import os
import logging
import shutil
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from . import __version__
from .config import Config, OutputConfig
from .dist import owns, writer_tag
from .data import dataset_fingerprint, load_rows, load_tokenizer, template_sha256, tokenize_dataset
from .layers import CONVENTION, read_model_info, resolve_layers
from .stats import write_token_freq
from .tiny import resolve_model_path
from .writer import FORMAT, FORMAT_VERSION, DatasetWriter, fault

log = logging.getLogger(__name__)

STORAGE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "fp8": 1}


class Interrupted(RuntimeError):
    """The run stopped early (signal or engine failure); what was committed is safe."""


def check_space(out_dir: str, need: int, policy: str) -> None:
    probe = out_dir
    while probe and not os.path.exists(probe):
        probe = os.path.dirname(probe) or "."
    free = shutil.disk_usage(probe or ".").free
    if need <= free or policy == "off":
        return
    msg = (f"the run will write about {need / 2**30:.2f} GiB to {out_dir} but only "
           f"{free / 2**30:.2f} GiB are free; free space, use another output.dir, or set "
           "output.space_check=warn")
    if policy == "raise":
        raise ValueError(msg)
    log.warning(msg)


@dataclass
class Summary:
    out_dir: str
    layers: List[int]
    written: int = 0
    already_done: int = 0
    skipped: Dict[str, int] = field(default_factory=dict)
    tokens: int = 0
    bytes: int = 0
    wall_s: float = 0.0
    engine_start_s: float = 0.0

    def lines(self) -> List[str]:
        rate = self.tokens / self.wall_s if self.wall_s else 0.0
        skipped = ", ".join(f"{k}={v}" for k, v in sorted(self.skipped.items())) or "none"
        return [
            f"dataset: {self.out_dir} (layers {self.layers})",
            f"samples written: {self.written}, already committed before this run: "
            f"{self.already_done}",
            f"samples skipped: {sum(self.skipped.values())} ({skipped})",
            f"tokens: {self.tokens} ({rate:,.0f} tokens/s over the run)",
            f"bytes written: {self.bytes:,} ({self.bytes / max(self.written, 1):,.0f} per sample)",
            f"wall time: {self.wall_s:.1f} s (engine start {self.engine_start_s:.1f} s)",
        ]


def _versions() -> Dict[str, str]:
    from importlib import metadata

    out = {"hsdump": __version__}
    for pkg in ("sglang", "torch", "transformers", "datasets", "safetensors"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "absent"
    return out


def rows_in_flight(out: OutputConfig, inflight_tokens: int, max_seq_len: int,
                   row_bytes: int) -> int:
    """Tokens of captured rows the engine may have in flight under `out.max_host_bytes`.

    The budget holds writer_threads + 2 shards (one filling, one queued, the rest being
    written; see writer.py), the rows in flight, and one more sample of max_seq_len rows: a
    sample prefilled in several chunks is stitched into one copy per slot before its chunks
    are freed (rows.Receiver.take). Raises when that leaves less than one sample."""
    held = (out.writer_threads + 2) * out.shard_bytes + max_seq_len * row_bytes
    inflight = min(inflight_tokens, max(0, out.max_host_bytes - held) // row_bytes)
    if inflight < max_seq_len:
        raise ValueError(
            f"output.max_host_bytes={out.max_host_bytes} holds {out.writer_threads + 2} shards "
            f"of {out.shard_bytes} bytes, one stitched sample and only {inflight} tokens of "
            f"rows in flight ({row_bytes} bytes per token), less than one sample of "
            f"dataset.max_seq_len={max_seq_len}; raise output.max_host_bytes, or lower "
            "output.shard_bytes or output.writer_threads")
    return inflight


def run(cfg: Config, resolved_config: Optional[dict] = None) -> Summary:
    t0 = time.time()
    if cfg.dist.num_jobs > 1 and cfg.output.overwrite:
        raise ValueError(
            f"output.overwrite=true with dist.num_jobs={cfg.dist.num_jobs}: each job would delete "
            "the shards the others already wrote. Empty output.dir once, then launch the jobs "
            "without output.overwrite")
    model_path = resolve_model_path(cfg.model.path)
    info = read_model_info(model_path, cfg.model.trust_remote_code)
    layers = resolve_layers(cfg.capture.layers, cfg.model.default_layers, info.num_hidden_layers)
    if info.max_position_embeddings and cfg.dataset.max_seq_len > info.max_position_embeddings:
        raise ValueError(f"dataset.max_seq_len={cfg.dataset.max_seq_len} exceeds the model's "
                         f"max_position_embeddings={info.max_position_embeddings}; lower it")

    tok = load_tokenizer(cfg.model, model_path)
    rows = load_rows(cfg.dataset)
    data = tokenize_dataset(rows, tok, cfg.dataset)
    if not data.ids:
        raise ValueError(f"no usable sample in {cfg.dataset.path} (skipped: {data.skipped})")

    compat = {
        "model": cfg.model.path, "architecture": info.architecture,
        "hidden_size": info.hidden_size, "num_hidden_layers": info.num_hidden_layers,
        "layers": layers, "final": list(cfg.capture.final),
        "storage_dtype": cfg.output.dtype, "model_dtype": cfg.model.dtype,
        "tokenizer": cfg.model.tokenizer or cfg.model.path,
        "chat_template_sha256": template_sha256(tok),
        "dataset": [cfg.dataset.path, cfg.dataset.name, cfg.dataset.split, cfg.dataset.revision,
                    cfg.dataset.column],
        "max_seq_len": cfg.dataset.max_seq_len, "truncation": cfg.dataset.truncation,
        "min_seq_len": cfg.dataset.min_seq_len, "format": data.format,
    }
    manifest = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "versions": _versions(),
        "hsdump_version": __version__, "sglang_version": _versions()["sglang"],
        "model": {"path": cfg.model.path, "resolved_path": model_path,
                  "architecture": info.architecture, "hidden_size": info.hidden_size,
                  "num_hidden_layers": info.num_hidden_layers, "dtype": cfg.model.dtype,
                  "tp_size": cfg.model.tp_size},
        "layers": layers, "convention": CONVENTION, "storage_dtype": cfg.output.dtype,
        "final": list(cfg.capture.final),
        "final_names": {k: "{i}/final/" + k for k in cfg.capture.final},
        "tokenizer": {"path": cfg.model.tokenizer or model_path,
                      "chat_template_sha256": template_sha256(tok)},
        "dataset": {"path": cfg.dataset.path, "name": cfg.dataset.name,
                    "split": cfg.dataset.split, "revision": cfg.dataset.revision,
                    "fingerprint": dataset_fingerprint(rows), "rows": data.rows,
                    "column": cfg.dataset.column, "skipped_rows": data.skipped},
        "max_seq_len": cfg.dataset.max_seq_len, "truncation": cfg.dataset.truncation,
        "tokenized": data.summary(),
        "config": resolved_config if resolved_config is not None else dataclasses.asdict(cfg),
    }
    # rows in flight are held once (bf16/fp16/fp32 as the engine runs) until written
    slots = len(layers) + len(cfg.capture.final)
    row_bytes = slots * info.hidden_size * STORAGE_BYTES[cfg.model.dtype]
    inflight = rows_in_flight(cfg.output, cfg.engine.inflight_tokens, cfg.dataset.max_seq_len,
                              row_bytes)
    engine_cfg = dataclasses.replace(cfg.engine, inflight_tokens=inflight)

    d = cfg.dist
    writer = DatasetWriter(cfg.output.dir, manifest, compat, layers=layers,
                           hidden_size=info.hidden_size, dtype=cfg.output.dtype,
                           shard_bytes=cfg.output.shard_bytes, overwrite=cfg.output.overwrite,
                           on_nonfinite=cfg.output.on_nonfinite,
                           writer_tag=writer_tag(d.num_jobs, d.job_index),
                           final=cfg.capture.final, threads=cfg.output.writer_threads)
    write_token_freq(data, cfg.output.dir, target_vocab_size=info.vocab_size)
    done = writer.done_ids()
    mine = [i for i, sid in enumerate(data.ids) if owns(sid, d.num_jobs, d.job_index)]
    todo = [i for i in mine if data.ids[i] not in done]
    summary = Summary(out_dir=cfg.output.dir, layers=layers, skipped=dict(data.skipped),
                      already_done=len(mine) - len(todo))
    need = sum(data.lengths[i] for i in todo) * (
        slots * (info.hidden_size * STORAGE_BYTES[cfg.output.dtype] + 4) + 16)
    try:
        check_space(cfg.output.dir, need + (need >> 6), cfg.output.space_check)
    except BaseException:
        writer.close(commit=False)
        raise
    if not todo:
        writer.close()
        log.info("nothing to do: all %d samples are committed", len(data.ids))
        summary.wall_s = time.time() - t0
        return summary

    from .engine import CaptureEngine, EngineDied  # the sglang import happens only now
    from tqdm import tqdm

    t_eng = time.time()
    try:
        engine = CaptureEngine(model_path, cfg.model, engine_cfg, layers, info,
                               final=cfg.capture.final)
    except BaseException:
        writer.close(commit=False)
        raise
    summary.engine_start_s = time.time() - t_eng
    bar = tqdm(total=len(todo), unit="sample", disable=not cfg.progress, dynamic_ncols=True)
    t_run = time.time()
    ok = False

    def sink(sid, input_ids, hidden_states, nonfinite):
        fault("sample")
        mask = data.loss_mask[pos[sid]]
        k = len(layers)
        final = dict(zip(engine.final, hidden_states[k:]))  # [seq, H] each
        # the engine checked NaN/Inf on the device: the writer does not scan the rows again
        # (final states: engine order -> the writer's order, that of capture.final)
        bad = [j if j < k else k + writer.final.index(engine.final[j - k]) for j in nonfinite]
        if writer.add(sid, input_ids, mask, hidden_states[:k], final, nonfinite=bad):
            summary.tokens += len(input_ids)
        bar.update(1)
        el = max(time.time() - t_run, 1e-9)
        bar.set_postfix_str(f"{summary.tokens / el:,.0f} tok/s, "
                            f"{writer.bytes_written / 2**20:,.0f} MiB written", refresh=False)

    pos = {data.ids[i]: i for i in todo}
    signals = {}

    def on_signal(name: str) -> None:
        if signals.get("seen"):
            log.warning("%s again: stopping at once", name)
            engine.abort()
            return
        signals["seen"] = name
        log.warning("%s: finishing the samples in flight, then committing and stopping "
                    "(send it again to stop at once)", name)
        engine.request_stop()

    died = None
    try:
        ok = engine.run(((data.ids[i], data.input_ids[i]) for i in todo), sink, on_signal)
    except EngineDied as e:
        died = e
    except KeyboardInterrupt:
        ok, signals["seen"] = False, signals.get("seen", "SIGINT") + " twice"
    finally:
        bar.close()
        try:
            engine.close()
        finally:
            writer.close(commit=True)
    summary.written = writer.samples_written
    summary.bytes = writer.bytes_written
    for k, v in writer.skipped.items():
        summary.skipped[k] = summary.skipped.get(k, 0) + v
    summary.wall_s = time.time() - t0
    resume = (f"{writer.samples_written} samples were committed in this run and are safe; "
              "run the same command again to resume.")
    if died is not None:
        raise Interrupted(f"the SGLang engine died: {died}. {resume}") from died
    if not ok:
        raise Interrupted(f"stopped by {signals.get('seen', 'request')}. {resume}")
    return summary
