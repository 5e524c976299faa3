"""The SGLang side of hsdump: the only module that imports sglang.

`CaptureEngine` runs `sglang.Engine` in-process. A patch installed in every scheduler process
(through `Engine.run_scheduler_process_func`, so it survives the `spawn` start method):

1. after the model loads, and so before CUDA graphs are captured, turns on EAGLE-3 aux capture
   and sets the model's `layers_to_capture` to the hf_hidden_states_index list (sorted);
2. wraps `LogitsProcessor.forward`: on the device, inside the forward, it packs the captured
   rows (and the final states, if asked) slot-major as `[S, tokens, H]` plus per-row NaN/Inf
   flags into one buffer, which SGLang's overlap scheduler then copies to the host in one
   non-blocking transfer (`rows.pack_rows`). Idle forwards (a DP-attention rank with no
   request in this step, 0 tokens or padded to the other ranks' length) pass through
   untouched;
3. wraps `SchedulerBatchResultProcessor.process_batch_result_prefill`: on attention-TP rank 0
   only (with DP attention: rank 0 of each DP group, which alone ran its requests), it
   slices that host buffer per request by the batch's extend lengths and sends each
   slice as S raw frames (each one contiguous) with (rid, start position, flagged slots) over
   a ZMQ PUSH socket of its own, and clears `logits_output.hidden_states` so SGLang's
   `.tolist()` path never runs. Every prefill chunk is sent, so chunked prefill loses nothing.

The caller's receiver thread (`rows.Receiver`) stitches chunks per rid by start position and
checks that the rows cover exactly `len(input_ids)` before a sample is handed on.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from .families import family_of
from .layers import ModelInfo
from .nodes import (KEY_FILE, NodeLayout, find_layout, read_run_keys, receiver_endpoint,
                    remove_run_keys, run_id, write_run_keys)
from .rows import (CaptureError, Receiver, Sender, bad_slots, flags_valid, new_run_keys,
                   pack_rows, unpack_rows)

if TYPE_CHECKING:
    from .config import EngineConfig, ModelConfig

log = logging.getLogger(__name__)

SUPPORTED_SGLANG = ("0.5.17", "0.5.23")
ENV = "HSDUMP_CAPTURE"
ROWS_TIMEOUT_S = 120.0

# sink(sample_id, input_ids, hidden_states, nonfinite): nonfinite lists the indices into
# hidden_states whose rows hold NaN or Inf, found on the device where the rows were captured
Sink = Callable[[int, List[int], List[torch.Tensor], List[int]], None]


class EngineDied(RuntimeError):
    """An SGLang process exited while hsdump was running."""


# --------------------------------------------------------------------------- CPU support
_STUB_C = "int cuPointerGetAttribute(void *d, int a, unsigned long long p) { return 1; }\n"


def load_libcuda_stub() -> None:
    """sglang-kernel's CUDA build needs `libcuda.so.1` to import; on a machine without a GPU
    driver, build a one-symbol stub, load it here and put it on LD_LIBRARY_PATH so every
    process SGLang spawns (schedulers, detokenizer) finds it too."""
    try:
        ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
        return
    except OSError:
        pass
    from .tiny import cache_dir

    stub = cache_dir() / "libcuda-stub" / "libcuda.so.1"
    if not stub.exists():
        stub.parent.mkdir(parents=True, exist_ok=True)
        src = stub.with_suffix(".c")
        src.write_text(_STUB_C)
        tmp = stub.with_name(f".libcuda.{os.getpid()}.so")
        subprocess.run(["cc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(tmp),
                        str(src)], check=True)
        os.replace(tmp, stub)
    ctypes.CDLL(str(stub), mode=ctypes.RTLD_GLOBAL)
    paths = [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p]
    if str(stub.parent) not in paths:
        os.environ["LD_LIBRARY_PATH"] = ":".join([str(stub.parent)] + paths)


def _prepare_process(device: str) -> None:
    if device == "cpu":
        os.environ["SGLANG_USE_CPU_ENGINE"] = "1"
        load_libcuda_stub()


# --------------------------------------------------------------------------- scheduler side
def _rank(name: str) -> Optional[int]:
    """This scheduler process's `name` rank (attn_tp_rank, attn_dp_rank, tp_rank, ...), or
    None where this SGLang build or process does not define it."""
    from sglang.srt.runtime_context import get_parallel

    try:
        value = getattr(get_parallel(), name)
    except Exception:  # not published in this process, or no such rank in this version
        return None
    return value if isinstance(value, int) else None


def _is_writer_rank() -> bool:
    """Attention-TP rank 0 sends. Without DP attention that is TP rank 0 of each replica;
    with `enable_dp_attention` every DP group (tp_size // dp_size ranks) runs its own
    requests and its attention-TP rank 0 sends them (dp_size == tp_size: every rank)."""
    attn_tp = _rank("attn_tp_rank")
    if attn_tp is None:
        attn_tp = _rank("tp_rank") or 0
    return attn_tp == 0 and (_rank("pp_rank") or 0) == 0


def _source(node: int = 0) -> str:
    """The sending process, named in every row header (rows.Receiver checks that each
    request's rows come from one process); its node when the engine spans several."""
    ranks = [(short, _rank(name)) for short, name in (("dp", "attn_dp_rank"), ("tp", "tp_rank"))]
    ranks = [f"{short}{r}" for short, r in ranks if r is not None]
    return "-".join(([f"node{node}"] if node else []) + ranks + [f"pid{os.getpid()}"])


def _is_idle(meta) -> bool:
    """An idle forward: under DP attention a rank with no request in this step still runs
    the model with the others (their MoE/MLP collectives need it). It has 0 tokens, or a
    dummy request padded to the others' length (`prepare_mlp_sync_batch` relabels it EXTEND
    and keeps the real mode in `_original_forward_mode`). It holds no request's rows, and
    SGLang discards its output (`process_batch_result_idle`)."""
    for attr in ("forward_mode", "_original_forward_mode"):
        mode = getattr(meta, attr, None)
        if mode is not None and getattr(mode, "is_idle", lambda: False)():
            return True
    return False


FINAL_KINDS = ("pre_norm", "post_norm")
_STASH: Dict[str, torch.Tensor] = {}  # this forward's pre-norm final state, per process


def _stash_pre_norm(module, args, output) -> None:
    # RMSNorm(x, residual) returns (normed, x + residual); RMSNorm(x) returns normed
    _STASH["pre_norm"] = output[1] if isinstance(output, tuple) else args[0]


def decoder_stack(model):
    """The module that runs the decoder layers and owns `layers_to_capture`, found by structure:
    `model.model` for a causal LM (LlamaForCausalLM, ...), `language_model.model` inside a
    vision-language wrapper (KimiK25ForConditionalGeneration, Gemma3ForConditionalGeneration,
    ...), the causal LM itself where it runs the layers (Qwen3_5ForCausalLM). One rule: the
    one submodule that has both `layers_to_capture` and a `layers` list."""
    found = [(name, m) for name, m in model.named_modules()
             if hasattr(m, "layers_to_capture") and isinstance(getattr(m, "layers", None),
                                                                torch.nn.ModuleList)]
    if len(found) != 1:
        names = [name or "<the model>" for name, _ in found]
        raise RuntimeError(f"hsdump: {type(model).__name__} has {len(found)} modules with "
                           f"decoder layers and layers_to_capture ({names}); expected one")
    return found[0][1]


def final_norm(stack):
    """The norm the last decoder layer feeds: the stack's one direct child norm module
    (`norm` in every family hsdump verified; the per-layer norms sit inside `layers`)."""
    norms = [(name, m) for name, m in stack.named_children() if "norm" in type(m).__name__.lower()]
    if len(norms) != 1:
        raise RuntimeError(f"hsdump: {type(stack).__name__} has {len(norms)} direct norm modules "
                           f"({[n for n, _ in norms]}); capture.final needs its one final norm")
    return norms[0][1]


def _stash_stream(k: int, module, args, output) -> None:
    # input_layernorm(hidden, residual) returns (normed, hidden + residual): the second is the
    # residual stream entering layer k. Cloned: the fused kernels update it in place later.
    if isinstance(output, tuple):
        _STASH[f"layer{k}"] = output[1].clone()


def tap_stream(stack, layers: Sequence[int]) -> None:
    """Take the stream entering each captured layer k from the residual sum of that layer's
    `input_layernorm`, for families whose SGLang aux capture records another tensor (Gemma-3:
    its layers keep the residual apart, and SGLang records the branch output, or on the GPU
    the buffer the fused add-norm overwrites with the normed input)."""
    import functools

    for k in layers:
        norm = getattr(stack.layers[k], "input_layernorm", None)
        if norm is None:
            raise RuntimeError(f"hsdump: decoder layer {k} of {type(stack).__name__} has no "
                               "input_layernorm to take the residual stream from")
        norm.register_forward_hook(functools.partial(_stash_stream, k))


def _install_patch(spec: dict) -> None:
    from sglang.srt.layers import logits_processor as lp
    from sglang.srt.managers.scheduler_components import batch_result_processor as brp
    from sglang.srt.model_executor import model_runner as mr

    layers = sorted(spec["layers"])
    final = [k for k in FINAL_KINDS if k in spec.get("final", [])]
    sender: Dict[str, Sender] = {}

    orig_load = mr.ModelRunner.load_model

    def load_model(self, *a, **k):
        out = orig_load(self, *a, **k)
        if getattr(self, "is_draft_worker", False):
            return out
        model = self.model
        if not hasattr(model, "set_eagle3_layers_to_capture"):
            raise RuntimeError(f"hsdump: {type(model).__name__} has no EAGLE-3 aux capture")
        model.set_eagle3_layers_to_capture([k - 1 for k in layers])
        stack = decoder_stack(model)
        stack.layers_to_capture = list(layers)  # entry i = stream entering layer i = HF hs[i]
        if hasattr(stack, "set_eagle3_layers_to_capture"):
            # a stack that captures through per-layer flags (Qwen3.5) gets them from the same
            # list: SGLang 0.5.17's wrapper setter leaves them unset (unverified family)
            for i, layer in enumerate(stack.layers):
                layer._is_layer_to_capture = i in layers
        if spec.get("tap_input_norm"):
            tap_stream(stack, layers)
        if "pre_norm" in final:
            final_norm(stack).register_forward_hook(_stash_pre_norm)
        return out

    mr.ModelRunner.load_model = load_model

    orig_logits = lp.LogitsProcessor.forward

    def logits_forward(self, input_ids, hidden_states, *args, **kwargs):
        out = orig_logits(self, input_ids, hidden_states, *args, **kwargs)
        pre = _STASH.pop("pre_norm", None)
        taps = [_STASH.pop(f"layer{k}", None) for k in layers] if spec.get("tap_input_norm") \
            else None
        aux = getattr(out, "hidden_states", None)
        t = hidden_states.shape[0]
        meta = kwargs.get("logits_metadata", args[1] if len(args) > 1 else None)
        if aux is None or t == 0 or _is_idle(meta):
            return out  # an idle DP-attention rank: no request's rows, passed through untouched
        parts = list(aux) if isinstance(aux, (list, tuple)) else [aux]
        if taps is not None:  # the stream itself, where SGLang's aux capture takes a branch
            if any(x is None for x in taps):
                raise RuntimeError("hsdump: a captured layer's input norm was not seen in this "
                                   "forward")
            parts = taps
        if any(p.shape[0] != t for p in parts):
            return out  # not a full-capture extend forward
        extra = {"pre_norm": pre, "post_norm": hidden_states}
        if any(extra[k] is None for k in final):
            raise RuntimeError("hsdump: the final norm's input was not seen in this forward")
        if torch.compiler.is_compiling() or (
                torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()):
            # a graph replay would reuse this buffer's memory while its copy to the host runs:
            # leave the rows unpacked, so a replay that returns them fails loudly in _emit_rows
            return out
        # a prefill CUDA graph pads the batch to a bucket (SGLang 0.5.17's breakable graph
        # runs this tail on the padded batch, then keeps [:real] rows), and so does DP
        # attention's MAX_LEN padding (every rank padded to the longest): pack the real rows only
        lens = getattr(meta, "extend_seq_lens_cpu", None)
        mode = getattr(meta, "forward_mode", None)
        n = int(sum(lens)) if lens is not None and mode is not None and mode.is_extend() else t
        if n > t:
            raise RuntimeError(f"hsdump: the batch extends {n} tokens but the forward has {t}")
        out.hidden_states = pack_rows(parts + [extra[k] for k in final], n, spec["hidden"])
        return out

    lp.LogitsProcessor.forward = logits_forward

    orig_prefill = brp.SchedulerBatchResultProcessor.process_batch_result_prefill

    def process_batch_result_prefill(self, batch, result):
        if batch.return_hidden_states:
            if "writer" not in sender:  # a process's ranks are fixed: look them up once
                sender["writer"] = _is_writer_rank()
            if sender["writer"]:
                if "s" not in sender:
                    sender["s"] = Sender.from_spec(spec["rows"], _source(spec["node_rank"]))
                _emit_rows(sender["s"], batch, result, spec["slots"], spec["hidden"])
            else:  # the other TP ranks hold the same rows: drop them, never .tolist() them
                out = getattr(result, "logits_output", None)
                if out is not None:
                    out.hidden_states = None
        return orig_prefill(self, batch, result)

    brp.SchedulerBatchResultProcessor.process_batch_result_prefill = process_batch_result_prefill


def _emit_rows(sender: Sender, batch, result, s: int, hidden: int) -> None:
    if getattr(result, "copy_done", None) is not None:
        result.copy_done.synchronize()
    out = getattr(result, "logits_output", None)
    hs = None if out is None else out.hidden_states
    if hs is None:
        sender.error("SGLang returned no hidden states for a prefill batch: aux capture is "
                     "not active in this SGLang build")
        return
    if isinstance(hs, (list, tuple)) or hs.dim() != 2 or hs.shape[-1] != s * hidden + s:
        shape = [tuple(h.shape) for h in hs] if isinstance(hs, (list, tuple)) else tuple(hs.shape)
        sender.error(f"captured rows have shape {shape}, expected [tokens, {s * hidden + s}] "
                     f"({s} slots x hidden size {hidden}, packed by hsdump's logits hook): "
                     "the model did not capture the asked layers, or SGLang ran the logits "
                     "processor inside a CUDA graph (prefill backend tc_piecewise; use the "
                     "default breakable backend or engine.extra.disable_prefill_cuda_graph=true)")
        return
    t = hs.shape[0]
    # overlap scheduling has copied the buffer to the host already (then .to is a no-op)
    rows, flags = unpack_rows(hs.to("cpu"), s, hidden)
    if not flags_valid(flags):
        sender.error(f"the captured rows of a {t}-token batch were resized between hsdump's "
                     "packing and the scheduler (their NaN/Inf flags hold other values than 0 "
                     "and 1), so their slots are misaligned; no rows of this batch are used. "
                     "This SGLang build pads or cuts the logits output in a way hsdump does "
                     "not handle: set engine.extra.disable_prefill_cuda_graph=true")
        return
    lens = getattr(result, "extend_input_len_per_req", None) or batch.extend_lens
    off = 0
    for req, start, n in zip(batch.reqs, batch.prefix_lens, lens):
        if getattr(req, "return_hidden_states", True):  # not a generation request's prompt
            sender.rows(req.rid, start, rows[:, off: off + n], bad_slots(flags[:, off: off + n]))
        off += n
    if off != t:
        sender.error(f"batch has {t} captured rows but its requests extend {off}")
    out.hidden_states = None  # SGLang's own per-request .tolist() path is skipped


def _ignore_stop_signals() -> None:
    # Ctrl-C and SIGTERM are the caller's: it stops cleanly and shuts the engine down
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def run_scheduler_process(*args, **kwargs):
    """Entry point of every SGLang scheduler process: install the patch, then run SGLang's."""
    _ignore_stop_signals()
    spec = json.loads(os.environ[ENV])
    _prepare_process(spec["device"])
    _install_patch(spec)
    from sglang.srt.managers.scheduler import run_scheduler_process as stock

    return stock(*args, **kwargs)


# --------------------------------------------------------------------------- caller side
def _finish_reason(out: dict, what: str):
    """A finished request's finish_reason; CaptureError if SGLang aborted it."""
    reason = (out.get("meta_info") or {}).get("finish_reason") or {}
    if isinstance(reason, dict) and reason.get("type") == "abort":
        raise CaptureError(f"{what}: SGLang aborted the request: {reason.get('message')}")
    return reason


_ACTIVE: Optional["CaptureEngine"] = None


def _sigquit(signum=None, frame=None) -> None:
    """SIGQUIT handler for the caller (module-level: SGLang deep-copies its server args)."""
    if _ACTIVE is not None:
        _ACTIVE._on_sigquit()


def _child_processes():
    import psutil

    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if "resource_tracker" not in " ".join(p.cmdline()):
                out.append(p)
        except psutil.Error:
            pass
    return out


def sglang_version() -> str:
    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        import sglang

        return sglang.__version__


def check_supported(info: ModelInfo, engine_cfg: "EngineConfig", model_cfg: "ModelConfig") -> str:
    """Refuse, before the engine starts, what would corrupt data or cannot work."""
    version = sglang_version()
    if version not in SUPPORTED_SGLANG:
        raise RuntimeError(f"sglang {version} is not supported; hsdump supports "
                           f"{', '.join(SUPPORTED_SGLANG)} (pip install sglang==0.5.23)")
    extra = engine_cfg.extra
    if extra.get("disable_radix_cache") is False:
        raise ValueError("engine.extra.disable_radix_cache=false: a prefix-cache hit computes "
                         "only the uncached suffix, so rows go missing. Remove the override.")
    if int(extra.get("pp_size", 1)) != 1:
        raise ValueError("engine.extra.pp_size must be 1: aux capture sees only the last "
                         "pipeline rank's layers. Use model.tp_size instead.")
    for key in ("speculative_algorithm", "speculative_draft_model_path", "enable_mixed_chunk"):
        if extra.get(key):
            raise ValueError(f"engine.extra.{key} is not supported by hsdump's capture; remove it")
    check_layout(extra)
    _prepare_process(engine_cfg.device)
    from sglang.srt.models.registry import ModelRegistry

    try:
        cls, _ = ModelRegistry.resolve_model_cls([info.architecture])
    except Exception as e:  # SGLang raises ValueError with its own list
        raise ValueError(f"SGLang has no model class for {info.architecture}: {e}") from e
    if not hasattr(cls, "set_eagle3_layers_to_capture"):
        raise ValueError(f"{info.architecture} ({cls.__name__}) has no EAGLE-3 aux capture in "
                         f"sglang {version}; hsdump cannot capture its layers. The classes "
                         "hsdump verified: README \"Model families\" (hsdump.families)")
    return version


# Parallel layouts whose rows were checked against transformers through extract.py on two
# H200s (SGLang 0.5.17, DeepSeek-V3 architecture; README "Serving layouts"): model.tp_size=N
# alone; with +engine.extra.dp_size=N +engine.extra.enable_dp_attention=true; with
# +engine.extra.ep_size=N (default moe_a2a_backend=none). dp_size without DP attention
# (replicas) was checked on Llama.
WORKING_LAYOUTS = ("model.tp_size=N +engine.extra.dp_size=N "
                   "+engine.extra.enable_dp_attention=true (DP attention), or model.tp_size=N "
                   "+engine.extra.ep_size=N (expert parallelism with the default "
                   "moe_a2a_backend=none), or model.tp_size=N alone")


def check_layout(extra: dict) -> None:
    """Refuse, before the engine starts, parallel layouts whose rows hsdump cannot deliver
    exactly or has not verified; each message names layouts that work."""
    a2a = extra.get("moe_a2a_backend")
    if a2a not in (None, "none"):
        raise ValueError(
            f"engine.extra.moe_a2a_backend={a2a}: hsdump's capture is not verified with an MoE "
            "all-to-all backend (deepep, mooncake, nixl, mori, pplx, flashinfer, ... need "
            "packages or an NVLink fabric that hsdump's test machines lack). Remove it: expert "
            "parallelism works with the default backend. Use " + WORKING_LAYOUTS)
    if extra.get("enable_two_batch_overlap"):
        raise ValueError(
            "engine.extra.enable_two_batch_overlap=true: SGLang runs the overlapped layers "
            "outside the loop that captures EAGLE-3 aux states, so captured layers go missing. "
            "Remove it; use " + WORKING_LAYOUTS)
    if int(extra.get("attn_cp_size") or 1) != 1:
        raise ValueError(
            f"engine.extra.attn_cp_size={extra['attn_cp_size']}: context parallelism splits "
            "each request's tokens across ranks, and SGLang does not gather the captured aux "
            "states back. Remove it; use " + WORKING_LAYOUTS)


def start_kwargs(c: "EngineConfig", generates: bool) -> dict:
    """SGLang's start-time settings for a run on the GPU: decode CUDA graphs only for a run that
    decodes, prefill graphs up to engine.prefill_cuda_graph_max_tokens (BENCHMARKS.md section
    12), FlashInfer's all-reduce fusion (and its JIT build) only if asked for, and a forward
    time limit that leaves room for the first forward's JIT (engine.watchdog_timeout)."""
    if c.device != "cuda":
        return {}
    kw = {} if c.flashinfer_allreduce_fusion else {
        "enforce_disable_flashinfer_allreduce_fusion": True}
    if c.watchdog_timeout is not None:
        kw["watchdog_timeout"] = c.watchdog_timeout
    if c.disable_cuda_graph:
        return kw
    decode = generates if c.decode_cuda_graph is None else c.decode_cuda_graph
    if not decode:
        kw["disable_decode_cuda_graph"] = True
    if c.prefill_cuda_graph_max_tokens == 0:
        kw["disable_prefill_cuda_graph"] = True
    elif c.prefill_cuda_graph_max_tokens is not None:
        kw["cuda_graph_max_bs_prefill"] = c.prefill_cuda_graph_max_tokens
    return kw


def dp_attention_offsets() -> List[int]:
    """Offsets from `port` of the TCP ports a one-node DP-attention engine binds."""
    try:
        from sglang.srt import server_args as sa

        zmq_delta = sa.ZMQ_TCP_PORT_DELTA
        handshake = getattr(sa, "DP_ATTENTION_HANDSHAKE_PORT_DELTA", 13)
    except (ImportError, AttributeError):
        zmq_delta, handshake = 233, 13
    return [handshake] + [zmq_delta + i for i in range(8)]


def dp_attention_port(kw: dict, rng=None) -> Optional[int]:
    """A `port` for a one-node DP-attention engine whose derived TCP ports are free, or None.

    Under DP attention SGLang binds TCP ports port + ZMQ_TCP_PORT_DELTA + 0..6 (233 in 0.5.17
    and 0.5.23; PortArgs.init_new) and port + DP_ATTENTION_HANDSHAKE_PORT_DELTA (13; the DP
    controller's worker-port handshake) from `port` alone (default 30000) instead of its
    per-engine IPC files, so a second such engine on the host (two jobs on one node, or a
    second engine in one process whose first still holds its sockets) waited 30 s and failed
    with "port_base at 30234 is not available". A port is free when SGLang's own check
    (`is_port_available`, the one its start-up waits on) says so. A port the user gives
    (engine.extra.port) or a multi-node setup (dist_init_addr) is left alone."""
    if not kw.get("enable_dp_attention") or "port" in kw or kw.get("dist_init_addr") \
            or kw.get("nnodes", 1) > 1:
        return None
    import random

    from sglang.srt.utils.network import is_port_available

    offsets = dp_attention_offsets()
    starts = list(range(30000, 40000, 100))
    (rng or random.Random()).shuffle(starts)  # two jobs starting together rarely pick the same
    for port in starts:
        if all(is_port_available(port + d) for d in offsets):
            return port
    raise RuntimeError("DP attention: no free TCP ports found in 30233-40240 for SGLang's "
                       "engine; give one with +engine.extra.port=<free port>")


def engine_kwargs(c: "EngineConfig", model_path: str, model_cfg: "ModelConfig", version: str,
                  layers: Sequence[int], generates: bool, family, layout: NodeLayout) -> dict:
    """sglang.Engine's keyword arguments for hsdump's capture (and for the other nodes of an
    engine over several nodes, which start the same engine with their node_rank)."""
    kw = dict(model_path=model_path, tp_size=model_cfg.tp_size, dtype=model_cfg.dtype,
              device=c.device, skip_tokenizer_init=True, disable_radix_cache=True,
              chunked_prefill_size=c.chunked_prefill_size,
              max_prefill_tokens=c.max_prefill_tokens,
              enable_return_hidden_states=True, disable_cuda_graph=c.disable_cuda_graph,
              trust_remote_code=model_cfg.trust_remote_code, log_level=c.log_level)
    for key in ("attention_backend", "sampling_backend", "mem_fraction_static",
                "max_running_requests", "max_total_tokens"):
        if getattr(c, key) is not None:
            kw[key] = getattr(c, key)
    # text only: a vision-language checkpoint (KimiK25ForConditionalGeneration, ...) loads
    # no image processor and runs no vision forward (its vision weights still load)
    kw["enable_multimodal"] = False
    if version != "0.5.17":
        # capture-only mode: aux capture with no draft model (the patch then sets the layers)
        kw.update(speculative_algorithm="EAGLE3", enable_return_aux_hidden_states=True,
                  return_aux_hidden_state_layer_ids=[k - 1 for k in sorted(layers)])
    kw.update(start_kwargs(c, generates))
    if layout.multi:
        kw.update(nnodes=layout.nnodes, node_rank=layout.node_rank,
                  dist_init_addr=layout.dist_init_addr)
    if family is not None and family.tap_input_norm and c.device == "cuda":
        # the stream taps are forward hooks: a graph replay would not run them
        kw["disable_prefill_cuda_graph"] = True
    kw.update(c.extra)
    port = dp_attention_port(kw)
    if port is not None:
        kw["port"] = port
    return kw


# --------------------------------------------------------------------------- several nodes
HEARTBEAT_S = 2.0


def engine_layout(c: "EngineConfig") -> NodeLayout:
    """This node's place in the engine, as engine.nnodes/node_rank/dist_init_addr say (the
    pipeline fills them in from SLURM where it applies: hsdump.pipeline.node_layout)."""
    return find_layout(c.nnodes, c.node_rank, c.dist_init_addr, env={})


def key_file(run_dir: Optional[str], job_tag: str = "") -> Path:
    """Where node 0 leaves the run's row keys for the other nodes of its engine: the output
    folder (on a shared file system), one file per job so engines of one dataset keep apart."""
    if not run_dir:
        raise ValueError("an engine over several nodes hands its row keys over in the output "
                         "folder: give CaptureEngine run_dir")
    name = KEY_FILE if not job_tag else KEY_FILE.replace(".json", f"-{job_tag}.json")
    return Path(run_dir) / name


def scheduler_spec(rows_spec: dict, layout: NodeLayout, layers, final, device: str, slots: int,
                   hidden: int, family) -> dict:
    """What every scheduler process of this node reads from the HSDUMP_CAPTURE variable."""
    return {"rows": rows_spec, "node_rank": layout.node_rank, "layers": list(layers),
            "final": list(final), "device": device, "slots": slots, "hidden": hidden,
            "tap_input_norm": bool(family and family.tap_input_norm)}


def follow(model_path: str, model_cfg: "ModelConfig", engine_cfg: "EngineConfig",
           layers: Sequence[int], info: ModelInfo, final: Sequence[str] = (),
           run_dir: Optional[str] = None, job_tag: str = "",
           key_timeout: float = 900.0, on_ready: Optional[Callable[[str], None]] = None) -> None:
    """A node k > 0 of an engine over several nodes: SGLang's schedulers of this node with
    hsdump's patch (those owning rows send them to node 0 over TCP), until node 0 is done.

    Waits for node 0's key file, sends node 0 a heartbeat every HEARTBEAT_S seconds, and
    returns when this node's schedulers exit (node 0 shut the engine down) or node 0 removed
    its key file (it closed). Raises EngineDied, after killing this node's schedulers, when
    node 0 stops taking heartbeats for engine.node_timeout seconds or a scheduler dies."""
    layout = engine_layout(engine_cfg)
    if layout.is_head:
        raise ValueError("follow() runs on the nodes after node 0")
    check_supported(info, engine_cfg, model_cfg)
    family = family_of(info.architecture)
    keys_at = key_file(run_dir, job_tag)
    started = time.time()
    log.info("node %d of %d: waiting for node 0's row keys in %s", layout.node_rank,
             layout.nnodes, keys_at)
    rows_spec = read_run_keys(keys_at, timeout=key_timeout, run=run_id(),
                              not_before=None if run_id() else started - 120)
    slots = len(layers) + len([k for k in FINAL_KINDS if k in final])
    os.environ[ENV] = json.dumps(scheduler_spec(rows_spec, layout, sorted(layers), final,
                                                engine_cfg.device, slots, info.hidden_size,
                                                family))
    beat = Sender.from_spec(rows_spec, f"node{layout.node_rank}",
                            send_timeout=engine_cfg.node_timeout)
    lost: List[str] = []
    stop = threading.Event()

    def heartbeats():
        while not stop.wait(HEARTBEAT_S):
            try:
                beat.heartbeat(layout.node_rank)
            except CaptureError as e:
                lost.append(str(e))
                return

    from sglang.srt.entrypoints.engine import Engine

    class HsdumpEngine(Engine):
        run_scheduler_process_func = staticmethod(run_scheduler_process)

    kwargs = engine_kwargs(engine_cfg, model_path, model_cfg, sglang_version(), layers, False,
                           family, layout)
    os.environ["SGLANG_BLOCK_NONZERO_RANK_CHILDREN"] = "0"  # return once the schedulers run
    threading.Thread(target=heartbeats, name="hsdump-heartbeat", daemon=True).start()
    engine = HsdumpEngine(**kwargs)
    children = _child_processes()
    if on_ready is not None:
        on_ready(f"node {layout.node_rank}: {len(children)} SGLang processes running; rows go "
                 f"to node 0 at {rows_spec['endpoint']}")
    try:
        while True:
            alive = [p for p in children if p.is_running() and p.status() != "zombie"]
            if not alive or not keys_at.exists():
                return  # node 0 shut the engine down, or closed
            if lost:
                raise EngineDied(f"node {layout.node_rank}: node 0 ({rows_spec['endpoint']}) "
                                 f"stopped taking this node's heartbeats: {lost[0]}")
            if len(alive) < len(children):
                raise EngineDied(f"node {layout.node_rank}: an SGLang process exited")
            time.sleep(0.5)
    finally:
        stop.set()
        for p in _child_processes():
            with contextlib.suppress(Exception):
                p.kill()
        with contextlib.suppress(Exception):
            beat.close(linger_s=0)
        del engine


class CaptureEngine:
    """open -> run(samples, sink) -> close. Samples are (sample_id, input_ids)."""

    def __init__(self, model_path: str, model_cfg: "ModelConfig", engine_cfg: "EngineConfig",
                 layers: Sequence[int], info: ModelInfo, final: Sequence[str] = (),
                 generates: bool = False, run_dir: Optional[str] = None, job_tag: str = ""):
        """generates: the run will call `generate` (decode steps), not only `run` (prefill).
        run_dir, job_tag: the output folder and the job's tag, where an engine over several
        nodes hands its row keys to the other nodes (hsdump.nodes.write_run_keys)."""
        self.version = check_supported(info, engine_cfg, model_cfg)
        self.generates = generates
        self.layers = list(layers)
        self.final = [k for k in FINAL_KINDS if k in final]
        self.hidden = info.hidden_size
        self.cfg = engine_cfg
        # aux rows arrive in ascending layer order, then the final states; this puts the
        # layers in the user's order, followed by the final states
        order = sorted(range(len(layers)), key=lambda j: layers[j])
        self._slot = [order.index(j) for j in range(len(layers))]
        self._slot += [len(layers) + f for f in range(len(self.final))]
        self.family = family_of(info.architecture)
        self.layout = engine_layout(engine_cfg)
        self._ipc_dir = tempfile.mkdtemp(prefix="hsdump-")
        self._key_file: Optional[Path] = None
        if self.layout.multi:
            if not self.layout.is_head:
                raise ValueError(f"node_rank={self.layout.node_rank}: only node 0 captures; "
                                 "the other nodes run hsdump.engine.follow")
            # rows from the other nodes' schedulers come over TCP, authenticated with this
            # run's keys, handed to those nodes through a 0600 file in the output folder
            self._rx = Receiver(receiver_endpoint(self.layout), keys=new_run_keys())
            rows_spec = self._rx.sender_spec()
            self._key_file = write_run_keys(key_file(run_dir, job_tag), rows_spec,
                                            run=run_id())
        else:
            self._rx = Receiver(f"ipc://{self._ipc_dir}/rows")
            rows_spec = self._rx.sender_spec()
        self._rx.start()
        os.environ[ENV] = json.dumps(scheduler_spec(rows_spec, self.layout, self.layers,
                                                    self.final, engine_cfg.device,
                                                    len(self._slot), info.hidden_size,
                                                    self.family))
        from sglang.srt.entrypoints.engine import Engine

        class HsdumpEngine(Engine):
            run_scheduler_process_func = staticmethod(run_scheduler_process)

        kwargs = engine_kwargs(engine_cfg, model_path, model_cfg, self.version, self.layers,
                               generates, self.family, self.layout)
        kwargs["custom_sigquit_handler"] = _sigquit
        global _ACTIVE
        _ACTIVE = self
        log.info("starting sglang %s engine: %s", self.version, kwargs)
        t0 = time.time()
        self._died: Optional[str] = None
        self._stop_requested = False
        self._aborted = False
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._wake: Optional[asyncio.Future] = None
        # SGLang's processes inherit ignored SIGINT/SIGTERM (a terminal's Ctrl-C reaches the
        # whole process group); the caller alone acts on them, once the engine is up.
        old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            self._engine = HsdumpEngine(**kwargs)
        except BaseException:
            self._rx.stop()
            if self._key_file is not None:
                remove_run_keys(self._key_file)
            for p in _child_processes():  # a failed start leaves no SGLang process behind
                with contextlib.suppress(Exception):
                    p.kill()
            raise
        finally:
            for s, h in old.items():
                signal.signal(s, h)
        signal.signal(signal.SIGQUIT, _sigquit)
        self._ready_at = time.monotonic()
        self._children = _child_processes()
        self._watchdog = threading.Thread(target=self._watch, name="hsdump-watchdog", daemon=True)
        self._watchdog.start()
        log.info("engine ready in %.1f s", time.time() - t0)

    # ---------------------------------------------------------------- health
    def _fail(self, message: str) -> None:
        if self._died is None:
            self._died = message
        if self._loop is not None and self._wake is not None:
            self._loop.call_soon_threadsafe(
                lambda: self._wake.done() or self._wake.set_result(None))

    def _on_sigquit(self, signum=None, frame=None) -> None:
        # SGLang's children send SIGQUIT to the caller when they fail
        self._fail("an SGLang process failed (its traceback is in the log above)")

    def _watch(self) -> None:
        while self._died is None:
            for p in self._children:
                try:
                    alive = p.is_running() and p.status() != "zombie"
                except Exception:
                    alive = False
                if not alive:
                    self._fail(f"SGLang process {p.pid} exited")
                    return
            silent = self._silent_node()
            if silent:
                self._fail(silent)
                return
            time.sleep(0.5)

    def _silent_node(self) -> Optional[str]:
        """The first other node of this engine whose heartbeats stopped, said as an error."""
        if not self.layout.multi:
            return None
        now, limit = time.monotonic(), self.cfg.node_timeout
        with self._rx.cond:
            beats = dict(self._rx.heartbeats)
        for node in range(1, self.layout.nnodes):
            last, host = beats.get(node, (self._ready_at, "?"))
            if now - last > limit:
                return (f"node {node} (host {host}) of this engine sent no heartbeat for "
                        f"{now - last:.0f} s (engine.node_timeout={limit:g}): it died or lost "
                        "its link to node 0. Committed samples stay; run the same command on "
                        "every node again to resume")
        return None

    @property
    def stop_requested(self) -> bool:
        return self._stop_requested

    def request_stop(self) -> None:
        """Stop submitting samples; those in flight finish. Safe to call from a signal handler."""
        self._stop_requested = True
        if self._loop is not None and self._wake is not None:
            self._loop.call_soon_threadsafe(
                lambda: self._wake.done() or self._wake.set_result(None))

    def abort(self) -> None:
        """Stop at once: `run` raises KeyboardInterrupt without waiting for samples in flight."""
        self._aborted = True
        self.request_stop()

    def _install_signal_handlers(self, on_stop_signal: Optional[Callable[[str], None]]):
        """SIGTERM and SIGQUIT belong to SGLang's tokenizer manager, which installs its own
        handlers on the event loop at the first request: give it hsdump's handler class.
        SIGINT (which SGLang leaves alone) gets a plain handler for the run."""
        engine = self

        class Handlers:
            def __init__(self, tokenizer_manager):
                pass

            def sigterm_handler(self, signum=None, frame=None):
                if on_stop_signal is not None:
                    on_stop_signal("SIGTERM")

            def running_phase_sigquit_handler(self, signum=None, frame=None):
                engine._on_sigquit()

        self._engine.tokenizer_manager.signal_handler_class = Handlers
        if on_stop_signal is None:
            return None
        return signal.signal(signal.SIGINT, lambda signum, frame: on_stop_signal("SIGINT"))

    # ---------------------------------------------------------------- driving
    def run(self, samples: Iterable[Tuple[int, List[int]]], sink: Sink,
            on_stop_signal: Optional[Callable[[str], None]] = None) -> bool:
        """Capture every sample and call `sink(sample_id, input_ids, hidden_states, nonfinite)`,
        where hidden_states is K tensors [seq, H] in the order of `layers`, followed by one per
        requested final state (in FINAL_KINDS order), in completion order, and nonfinite the
        indices into hidden_states of the tensors that hold NaN/Inf (checked on the device).
        `on_stop_signal(name)` is called on SIGINT / SIGTERM while it runs.
        Returns False if `request_stop()` ended it early; raises KeyboardInterrupt after
        `abort()`, EngineDied if SGLang died."""
        self._tag = uuid.uuid4().hex[:8]  # request ids unique per run: a sample id may recur
        return self._run_on_loop(self._drive(iter(samples), sink), on_stop_signal)

    def generate(self, requests: Sequence[Tuple[object, List[int], dict]],
                 on_stop_signal: Optional[Callable[[str], None]] = None) -> Dict[object, dict]:
        """Generate a continuation of each (key, input_ids, sampling_params), nothing captured:
        {key: {"text", "output_ids", "finish_reason"}}. All requests are submitted at once and
        SGLang's scheduler batches them (generation holds no captured rows on the host, so
        `inflight_tokens` does not bound it: bounded by it, 256 requests of 512 + 256 tokens
        ran at 0.86 of SGLang's own batched generate on an H200, BENCHMARKS section 10). The
        caller bounds the number (regenerate.window). Raises EngineDied if SGLang died;
        returns what finished if `request_stop()` ended it early."""
        return self._run_on_loop(self._generate(list(requests)), on_stop_signal)

    def _run_on_loop(self, coro, on_stop_signal):
        """Run `coro` on SGLang's event loop with hsdump's stop-signal handlers."""
        loop = self._engine.loop
        self._loop = loop
        old_sigint = self._install_signal_handlers(on_stop_signal)
        try:
            return loop.run_until_complete(coro)
        finally:
            if old_sigint is not None:
                signal.signal(signal.SIGINT, old_sigint)

    async def _generate(self, requests) -> Dict[object, dict]:
        tag = uuid.uuid4().hex[:8]

        async def one(i, key, ids, sp):
            out = await self._engine.async_generate(input_ids=list(ids), sampling_params=sp,
                                                    rid=f"hsdump-gen-{tag}-{i}")
            reason = _finish_reason(out, f"generation for {key}")
            return key, {"text": out.get("text", ""), "output_ids": out.get("output_ids"),
                         "finish_reason": reason}

        tasks = {asyncio.ensure_future(one(i, key, ids, sp))
                 for i, (key, ids, sp) in enumerate(requests)}
        results: Dict[object, dict] = {}
        self._wake = asyncio.get_running_loop().create_future()
        try:
            while tasks and not self._stop_requested:  # stopped: the rest is cancelled
                self._check_alive()
                done, tasks = await asyncio.wait(tasks | {self._wake},
                                                 return_when=asyncio.FIRST_COMPLETED)
                tasks.discard(self._wake)
                for task in done:
                    if task is self._wake:
                        self._wake = asyncio.get_running_loop().create_future()
                        continue
                    key, res = task.result()
                    results[key] = res
        finally:
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
        return results

    def _check_alive(self) -> None:
        if self._died is not None:
            raise EngineDied(self._died)
        if self._aborted:
            raise KeyboardInterrupt

    async def _one(self, sid: int, ids: List[int]):
        rid = f"hsdump-{self._tag}-{sid}"
        try:
            out = await self._engine.async_generate(
                input_ids=ids, sampling_params={"max_new_tokens": 1, "temperature": 0.0},
                return_hidden_states=True, rid=rid)
            _finish_reason(out, f"sample {sid}")
            loop = asyncio.get_running_loop()
            rows, bad = await loop.run_in_executor(None, self._rx.take, rid, len(ids),
                                                   ROWS_TIMEOUT_S)
        except BaseException:
            self._rx.discard(rid)
            raise
        # rows: one [seq, H] tensor per slot (sorted layers, then final) -> the user's order
        return sid, ids, [rows[s] for s in self._slot], [j for j, s in enumerate(self._slot)
                                                         if s in bad]

    async def _drive(self, samples, sink: Sink) -> bool:
        budget = self.cfg.inflight_tokens
        inflight: Dict[asyncio.Future, int] = {}
        used = 0
        nxt = next(samples, None)
        self._wake = asyncio.get_running_loop().create_future()
        try:
            while True:
                self._check_alive()
                if self._stop_requested:
                    nxt = None
                if nxt is None and not inflight:
                    return not self._stop_requested
                while nxt is not None and (not inflight or used + len(nxt[1]) <= budget):
                    sid, ids = nxt
                    inflight[asyncio.ensure_future(self._one(sid, list(ids)))] = len(ids)
                    used += len(ids)
                    nxt = next(samples, None)
                if self._wake.done():
                    self._wake = asyncio.get_running_loop().create_future()
                done, _ = await asyncio.wait(list(inflight) + [self._wake],
                                             return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    if task is self._wake:
                        continue
                    used -= inflight.pop(task)
                    sink(*task.result())
                # a finished task holds its sample's rows: these names kept the last one alive
                # through the next wait, after the writer had written it (one sample, 0.81 GB
                # at 32K x 8B, measured with bench/mem_bench.py --caller-only)
                done = task = None
        finally:
            for task in inflight:
                task.cancel()
            if inflight:
                await asyncio.gather(*inflight, return_exceptions=True)

    def sources(self) -> Dict[str, Dict[str, int]]:
        """Rows received per sending scheduler process ({"dp0-tp0-pid..": {"messages",
        "rows"}}): one entry per DP group's attention-TP rank 0 (or per replica)."""
        with self._rx.cond:
            return {k: dict(v) for k, v in self._rx.sources.items()}

    def close(self) -> None:
        self._died = self._died or "closed"  # stops the watchdog
        try:
            self._engine.shutdown()
        finally:
            self._rx.stop()
            if self._key_file is not None:  # tells the other nodes this run is over
                remove_run_keys(self._key_file)
            try:
                for p in Path(self._ipc_dir).iterdir():
                    p.unlink()
                os.rmdir(self._ipc_dir)
            except OSError:
                pass

    def __enter__(self) -> "CaptureEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
