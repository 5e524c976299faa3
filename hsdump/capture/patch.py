"""The patch SGLang's scheduler processes run (installed through
`Engine.run_scheduler_process_func`, so it survives the `spawn` start method).

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

import ctypes
import json
import logging
import os
import signal
import subprocess
from typing import TYPE_CHECKING, Dict, Optional, Sequence

import torch

from hsdump.capture.rows import (
    Sender,
    bad_slots,
    flags_valid,
    pack_rows,
    unpack_rows,
)

if TYPE_CHECKING:
    pass
from hsdump.store.layout import FINAL_KINDS

log = logging.getLogger(__name__)
ENV = "HSDUMP_CAPTURE"


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
    from hsdump.tiny import cache_dir

    stub = cache_dir() / "libcuda-stub" / "libcuda.so.1"
    if not stub.exists():
        stub.parent.mkdir(parents=True, exist_ok=True)
        src = stub.with_suffix(".c")
        src.write_text(_STUB_C)
        tmp = stub.with_name(f".libcuda.{os.getpid()}.so")
        subprocess.run(
            ["cc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(tmp), str(src)],
            check=True,
        )
        os.replace(tmp, stub)
    ctypes.CDLL(str(stub), mode=ctypes.RTLD_GLOBAL)
    paths = [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p]
    if str(stub.parent) not in paths:
        os.environ["LD_LIBRARY_PATH"] = ":".join([str(stub.parent)] + paths)


def prepare_process(device: str) -> None:
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
    found = [
        (name, m)
        for name, m in model.named_modules()
        if hasattr(m, "layers_to_capture")
        and isinstance(getattr(m, "layers", None), torch.nn.ModuleList)
    ]
    if len(found) != 1:
        names = [name or "<the model>" for name, _ in found]
        raise RuntimeError(
            f"hsdump: {type(model).__name__} has {len(found)} modules with "
            f"decoder layers and layers_to_capture ({names}); expected one"
        )
    return found[0][1]


def final_norm(stack):
    """The norm the last decoder layer feeds: the stack's one direct child norm module
    (`norm` in every family hsdump verified; the per-layer norms sit inside `layers`), or the
    one named `norm` where the stack has more (Gemma-4's per-layer-input projection norm)."""
    norms = [(name, m) for name, m in stack.named_children() if "norm" in type(m).__name__.lower()]
    if len(norms) > 1:
        norms = [(name, m) for name, m in norms if name == "norm"] or norms
    if len(norms) != 1:
        raise RuntimeError(
            f"hsdump: {type(stack).__name__} has {len(norms)} direct norm modules "
            f"({[n for n, _ in norms]}); capture.final needs its one final norm"
        )
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
            raise RuntimeError(
                f"hsdump: decoder layer {k} of {type(stack).__name__} has no "
                "input_layernorm to take the residual stream from"
            )
        norm.register_forward_hook(functools.partial(_stash_stream, k))


def _layer_flags(stack) -> bool:
    """Whether the stack captures through per-layer flags (it has a setter of its own)."""
    return hasattr(stack, "set_eagle3_layers_to_capture") or hasattr(
        stack, "set_dflash_layers_to_capture"
    )


def _set_layers(stack, layers: Sequence[int], flags: bool) -> None:
    """hsdump's capture list on the decoder stack: entry i of `layers_to_capture` is the stream
    entering layer i (transformers' hidden_states[i]); per-layer flags where the stack captures
    through them (Qwen3.5)."""
    stack.layers_to_capture = list(layers)
    if flags:
        for i, layer in enumerate(stack.layers):
            layer._is_layer_to_capture = i in layers


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
        stack = decoder_stack(model)
        # a stack that captures through per-layer flags (Qwen3.5) gets them from the same list:
        # SGLang 0.5.17's wrapper setter leaves them unset, and its text class has no setter
        flags = _layer_flags(stack)
        if hasattr(model, "set_eagle3_layers_to_capture"):
            model.set_eagle3_layers_to_capture([k - 1 for k in layers])
        elif not flags:
            raise RuntimeError(f"hsdump: {type(model).__name__} has no EAGLE-3 aux capture")
        _set_layers(stack, layers, flags)
        if spec.get("tap_input_norm"):
            tap_stream(stack, layers)
        if "pre_norm" in final:
            final_norm(stack).register_forward_hook(_stash_pre_norm)
        return out

    mr.ModelRunner.load_model = load_model

    # SGLang 0.5.23 calls the model's setter again after the load, from
    # `init_attention_backends` (`configure_aux_hidden_state_capture`, before any CUDA graph is
    # captured), with `return_aux_hidden_state_layer_ids`, and each family's setter maps those
    # ids by its own rule: Llama's adds 1 to every id (hsdump's list again), DeepSeek-V2/V3's
    # (Kimi-K2.5's text model) and GLM-4-MoE-Lite's add 1 only when the first id is 1, which
    # would capture [2, 30, 58] for hsdump's [3, 31, 59]. hsdump's list is set again after it.
    orig_backends = getattr(mr.ModelRunner, "init_attention_backends", None)
    if orig_backends is not None:

        def init_attention_backends(self, *a, **k):
            out = orig_backends(self, *a, **k)
            if not getattr(self, "is_draft_worker", False):
                stack = decoder_stack(self.model)
                _set_layers(stack, layers, _layer_flags(stack))
            return out

        mr.ModelRunner.init_attention_backends = init_attention_backends

    orig_logits = lp.LogitsProcessor.forward

    def logits_forward(self, input_ids, hidden_states, *args, **kwargs):
        out = orig_logits(self, input_ids, hidden_states, *args, **kwargs)
        pre = _STASH.pop("pre_norm", None)
        taps = (
            [_STASH.pop(f"layer{k}", None) for k in layers] if spec.get("tap_input_norm") else None
        )
        aux = getattr(out, "hidden_states", None)
        t = hidden_states.shape[0]
        meta = kwargs.get("logits_metadata", args[1] if len(args) > 1 else None)
        if aux is None or t == 0 or _is_idle(meta):
            return out  # an idle DP-attention rank: no request's rows, passed through untouched
        parts = list(aux) if isinstance(aux, (list, tuple)) else [aux]
        if taps is not None:  # the stream itself, where SGLang's aux capture takes a branch
            if any(x is None for x in taps):
                raise RuntimeError(
                    "hsdump: a captured layer's input norm was not seen in this forward"
                )
            parts = taps
        if any(p.shape[0] != t for p in parts):
            return out  # not a full-capture extend forward
        extra = {"pre_norm": pre, "post_norm": hidden_states}
        if any(extra[k] is None for k in final):
            raise RuntimeError("hsdump: the final norm's input was not seen in this forward")
        if torch.compiler.is_compiling() or (
            torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
        ):
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
        sender.error(
            "SGLang returned no hidden states for a prefill batch: aux capture is "
            "not active in this SGLang build"
        )
        return
    if isinstance(hs, (list, tuple)) or hs.dim() != 2 or hs.shape[-1] != s * hidden + s:
        shape = [tuple(h.shape) for h in hs] if isinstance(hs, (list, tuple)) else tuple(hs.shape)
        sender.error(
            f"captured rows have shape {shape}, expected [tokens, {s * hidden + s}] "
            f"({s} slots x hidden size {hidden}, packed by hsdump's logits hook): "
            "the model did not capture the asked layers, or SGLang ran the logits "
            "processor inside a CUDA graph (prefill backend tc_piecewise; use the "
            "default breakable backend or engine.extra.disable_prefill_cuda_graph=true)"
        )
        return
    t = hs.shape[0]
    # overlap scheduling has copied the buffer to the host already (then .to is a no-op)
    rows, flags = unpack_rows(hs.to("cpu"), s, hidden)
    if not flags_valid(flags):
        sender.error(
            f"the captured rows of a {t}-token batch were resized between hsdump's "
            "packing and the scheduler (their NaN/Inf flags hold other values than 0 "
            "and 1), so their slots are misaligned; no rows of this batch are used. "
            "This SGLang build pads or cuts the logits output in a way hsdump does "
            "not handle: set engine.extra.disable_prefill_cuda_graph=true"
        )
        return
    lens = getattr(result, "extend_input_len_per_req", None) or batch.extend_lens
    off = 0
    for req, start, n in zip(batch.reqs, batch.prefix_lens, lens):
        if getattr(req, "return_hidden_states", True):  # not a generation request's prompt
            sender.rows(req.rid, start, rows[:, off : off + n], bad_slots(flags[:, off : off + n]))
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
    prepare_process(spec["device"])
    _install_patch(spec)
    from sglang.srt.managers.scheduler import run_scheduler_process as stock

    return stock(*args, **kwargs)
