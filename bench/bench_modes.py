"""bench.py's engines and timed modes: a (plain SGLang prefill), b0/b/b8 (hsdump's capture,
rows dropped or written to disk in bf16 or fp8) and c (SGLang's built-in hidden-state path),
each over the workloads of one model; the fp8 encoding's host cost."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import time
import traceback
from pathlib import Path
from typing import Dict, List, Optional

import torch

HERE = Path(__file__).resolve().parent

AUX_ENV = "HSDUMP_BENCH_AUX_LAYERS"
WRITER_OPTS: Dict[str, int] = {}  # DatasetWriter's threads / shard_bytes (--writer-threads, ...)


# --------------------------------------------------------------------------- engines
def _prepare(device: str) -> None:
    """SGLang's CPU engine switch and libcuda stub, as in every scheduler process."""
    from hsdump.capture.patch import prepare_process

    prepare_process(device)


def engine_config(device: str, mem_fraction: Optional[float]):
    """conf/engine/cpu.yaml or conf/engine/gpu.yaml (mem_fraction_static overridable; as in
    gpu.yaml no prefill CUDA graphs, and plain_kwargs and hsdump's engine skip the decode graphs
    of a run that never decodes)."""
    from hsdump.capture.start import engine_preset

    over = {"mem_fraction_static": mem_fraction} if mem_fraction else {}
    return engine_preset("cpu" if device == "cpu" else "gpu", **over)


def plain_kwargs(model_path: str, ec, tp: int = 1) -> dict:
    """The keyword arguments hsdump's engine gives sglang, minus everything about capture."""
    from hsdump.capture.serving import plain_kwargs as engine_settings
    from hsdump.capture.serving import start_kwargs
    from hsdump.config import ModelConfig

    kw = engine_settings(ec, model_path, ModelConfig(path=model_path, tp_size=tp))
    kw.update(start_kwargs(ec, False))  # the CUDA graphs of a run that never decodes
    kw.update(ec.extra)  # e.g. load_format="dummy" (--weights dummy), as hsdump's engine does
    return kw


def aux_scheduler_process(*args, **kwargs):
    """Scheduler entry for mode c on SGLang 0.5.17 (device README §4), plus the same
    layers_to_capture override hsdump makes, so both capture the same HF indices."""
    layers = sorted(int(x) for x in os.environ[AUX_ENV].split(","))
    from sglang.srt.model_executor import model_runner as mr

    orig = mr.ModelRunner.load_model

    def load_model(self, *a, **k):
        out = orig(self, *a, **k)
        if not getattr(self, "is_draft_worker", False):
            self.model.set_eagle3_layers_to_capture([k - 1 for k in layers])
            self.model.model.layers_to_capture = list(layers)
        return out

    mr.ModelRunner.load_model = load_model
    from sglang.srt.managers.scheduler import run_scheduler_process

    return run_scheduler_process(*args, **kwargs)


def builtin_engine(model_path: str, ec, layers: List[int], version: str, tp: int = 1):
    from sglang.srt.entrypoints.engine import Engine

    kw = plain_kwargs(model_path, ec, tp)
    kw["enable_return_hidden_states"] = True
    if version == "0.5.17":
        os.environ[AUX_ENV] = ",".join(str(k) for k in layers)

        class AuxEngine(Engine):
            run_scheduler_process_func = staticmethod(aux_scheduler_process)

        return AuxEngine(**kw)
    kw.update(
        speculative_algorithm="EAGLE3",
        enable_return_aux_hidden_states=True,
        return_aux_hidden_state_layer_ids=[k - 1 for k in sorted(layers)],
    )
    return Engine(**kw)


SP = {"max_new_tokens": 1, "temperature": 0.0}


def _rate(tokens: int, samples: int, walls: List[float], **extra) -> dict:
    """Rates from the median wall time of the repeats (all walls are kept)."""
    wall = statistics.median(walls)
    d = {
        "wall_s": wall,
        "walls_s": walls,
        "tokens": tokens,
        "samples": samples,
        "tokens_per_s": tokens / wall,
        "samples_per_s": samples / wall,
    }
    d.update(extra)
    return d


def sharegpt_lengths() -> List[int]:
    """ShareGPT V3's token lengths under the Llama-3.1 template (bench/sharegpt_lengths.py)."""
    return json.loads((HERE / "sharegpt_v3_lengths.json").read_text())["lengths"]


def _count_within(lens: List[int], budget: int) -> int:
    """How many of the first lengths fit in `budget` tokens (at least one)."""
    total = 0
    for i, m in enumerate(lens):
        total += m
        if total > budget:
            return max(1, i)
    return len(lens)


class Workload:
    """One sequence length: the timed samples, the warm-up samples, the built-in subset."""

    def __init__(self, seq: int, samples, warm, n_builtin: int):
        self.seq, self.samples, self.warm, self.n_builtin = seq, samples, warm, n_builtin
        self.tokens = sum(len(s) for s in samples)


def mode_plain(model_path, ec, loads: List[Workload], mon, repeat: int = 1, tp: int = 1) -> dict:
    """Mode a. Returns {seq: result} plus "_engine" facts."""
    from sglang.srt.entrypoints.engine import Engine

    out = {"_engine": {"baseline": mon.reset()}}
    t0 = time.time()
    eng = Engine(**plain_kwargs(model_path, ec, tp))
    out["_engine"]["engine_start_s"] = time.time() - t0
    try:
        for w in loads:
            t = time.time()
            eng.generate(input_ids=w.warm, sampling_params=SP, return_hidden_states=False)
            warm_s = time.time() - t
            idle = mon.reset()
            walls = []
            for _ in range(repeat):
                t = time.time()
                outs = eng.generate(
                    input_ids=w.samples, sampling_params=SP, return_hidden_states=False
                )
                walls.append(time.time() - t)
                assert len(outs) == len(w.samples)
            out[w.seq] = _rate(
                w.tokens, len(w.samples), walls, warmup_s=warm_s, idle=idle, **mon.peaks()
            )
    finally:
        eng.shutdown()
    return out


def mode_hsdump(
    model_path,
    ec,
    loads: List[Workload],
    layers,
    info,
    out_dir,
    mon,
    repeat: int = 1,
    storages=("bfloat16",),
    fp8_tokens: int = 0,
    on_partial=None,
    tp: int = 1,
    final=(),
) -> dict:
    """Modes b0 (capture, rows dropped), b (capture + DatasetWriter to disk) and b8 (the same
    with storage fp8, if "fp8" is in `storages`), one engine. b8 runs on the first samples
    holding `fp8_tokens` tokens (0: all of b's). `on_partial(seq, results)` is called after
    each of them, so that a run cut short keeps what it measured."""
    from hsdump.capture.base import Request
    from hsdump.capture.start import rows_manifest, start
    from hsdump.store.writer import DatasetWriter

    out = {"_engine": {"baseline": mon.reset()}}
    t0 = time.time()
    eng = start(model_path, layers, ec, tp_size=tp, info=info, final=final)
    out["_engine"].update(engine_start_s=time.time() - t0, sglang=eng.version)
    k_bytes = (len(layers) + len(final)) * info.hidden_size * 2
    ds_dir = os.path.join(out_dir, "dataset")
    sid_base = [0]

    def sids(items):  # request ids must not repeat within one engine
        sid_base[0] += 1_000_000
        return [Request(sid_base[0] + i, s, [1] * len(s)) for i, s in enumerate(items)]

    def to_disk(samples: List[List[int]], storage: str) -> dict:
        """Capture + DatasetWriter(dtype=storage), timed until close() has committed all."""
        tokens = sum(len(x) for x in samples)
        manifest = rows_manifest(model_path, layers, info, storage_dtype=storage, final=final)
        idle = mon.reset()
        walls, details = [], []
        for _ in range(repeat):
            shutil.rmtree(ds_dir, ignore_errors=True)
            t = time.time()
            writer = DatasetWriter(ds_dir, manifest, **WRITER_OPTS)

            try:
                eng.run(sids(samples), writer.add_sample)
                t_run = time.time() - t
            finally:
                t_c = time.time()
                writer.close()
                close_s = time.time() - t_c
            walls.append(time.time() - t)
            assert writer.samples_written == len(samples)
            details.append(
                {
                    "run_s": t_run,
                    "sink_add_s": writer.timing["add_s"],
                    "final_close_s": close_s,
                    "bytes_written": writer.bytes_written,
                    "writer_timing": dict(writer.timing),
                    "shards": writer.shards_written,
                }
            )
            shutil.rmtree(ds_dir, ignore_errors=True)
        wall = statistics.median(walls)
        n_bytes = details[0]["bytes_written"]
        # run phase: until the engine has handed the last sample to the writer; the rest
        # of the wall is the final flush (the last shards written and fsynced), a fixed
        # cost per run that a long extraction amortizes
        run_rate = tokens / statistics.median([d["run_s"] for d in details])
        return _rate(
            tokens,
            len(samples),
            walls,
            storage_dtype=storage,
            bytes_written=n_bytes,
            bytes_per_token=n_bytes / tokens,
            run_tokens_per_s=run_rate,
            bytes_written_per_s=n_bytes / wall,
            payload_bytes_per_s=tokens * k_bytes / wall,
            repeats=details,
            idle=idle,
            **mon.peaks(),
        )

    try:
        for w in loads:
            res = {}
            t = time.time()
            eng.run(sids(w.warm), lambda s: None)
            res["warmup_s"] = time.time() - t

            got = [0, 0]

            def null_sink(s):
                got[0] += 1
                got[1] += s.layers[0].shape[0]

            idle = mon.reset()
            walls = []
            for _ in range(repeat):
                got[:] = [0, 0]
                t = time.time()
                eng.run(sids(w.samples), null_sink)
                walls.append(time.time() - t)
                assert got == [len(w.samples), w.tokens], got
            res["b0"] = _rate(
                w.tokens,
                len(w.samples),
                walls,
                payload_bytes_per_s=w.tokens * k_bytes / statistics.median(walls),
                idle=idle,
                **mon.peaks(),
            )
            if on_partial:
                on_partial(w.seq, res)
            for storage in storages:
                key = "b8" if storage == "fp8" else "b"
                samples = w.samples
                if storage == "fp8" and fp8_tokens:
                    samples = w.samples[: _count_within([len(x) for x in w.samples], fp8_tokens)]
                try:
                    res[key] = to_disk(samples, storage)
                except Exception as e:  # b8 failing must not lose b
                    res[key] = {
                        "error": f"{type(e).__name__}: {e}",
                        "traceback": traceback.format_exc()[-3000:],
                    }
                    print(traceback.format_exc())
                    if key == "b":
                        raise
                if on_partial:
                    on_partial(w.seq, res)
            out[w.seq] = res
    finally:
        eng.close()
        shutil.rmtree(ds_dir, ignore_errors=True)
    return out


def fp8_host_cost(hidden: int, slots: int, seq: int = 2048, reps: int = 3) -> dict:
    """Time of the writer's fp8 encoding (hsdump.store.fp8.quantize, on the CPU, in writer.add on
    the caller's thread) for one sample of `slots` [seq, hidden] bf16 tensors."""
    from hsdump.store import fp8

    xs = [torch.randn(seq, hidden).to(torch.bfloat16) for _ in range(slots)]
    for x in xs:
        fp8.quantize(x)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        for x in xs:
            fp8.quantize(x)
        times.append(time.perf_counter() - t)
    ms = statistics.median(times) * 1e3
    return {
        "seq": seq,
        "hidden": hidden,
        "slots": slots,
        "torch_threads": torch.get_num_threads(),
        "ms_per_sample": ms,
        "tokens_per_s_ceiling": seq / (ms / 1e3),
    }


def mode_builtin(
    model_path, ec, loads: List[Workload], layers, info, version, mon, repeat: int = 1, tp: int = 1
) -> dict:
    """Mode c: SGLang's own return path, the caller keeping every returned list."""
    out = {"_engine": {"baseline": mon.reset()}}
    t0 = time.time()
    eng = builtin_engine(model_path, ec, layers, version, tp)
    out["_engine"]["engine_start_s"] = time.time() - t0
    width = len(layers) * info.hidden_size
    try:
        for w in loads:
            if w.n_builtin < 1:
                continue  # not measured at this length (--models MODEL:SEQ:N:0)
            samples = w.samples[: w.n_builtin]
            n_tok = sum(len(s) for s in samples)
            t = time.time()
            eng.generate(input_ids=w.warm[:1], sampling_params=SP, return_hidden_states=True)
            warm_s = time.time() - t
            idle = mon.reset()
            walls = []
            for _ in range(repeat):
                t = time.time()
                outs = eng.generate(
                    input_ids=samples, sampling_params=SP, return_hidden_states=True
                )
                collected = [o["meta_info"]["hidden_states"][0] for o in outs]
                walls.append(time.time() - t)
                for s, hs in zip(samples, collected):
                    assert len(hs) == len(s) and len(hs[0]) == width, (len(hs), len(hs[0]), width)
                del outs, collected
            out[w.seq] = _rate(
                n_tok,
                len(samples),
                walls,
                payload_bytes_per_s=n_tok * width * 2 / statistics.median(walls),
                warmup_s=warm_s,
                idle=idle,
                **mon.peaks(),
            )
    finally:
        eng.shutdown()
    return out
