"""Serving layouts and ports: which SGLang version and model class hsdump captures, the
layouts it refuses, the keyword arguments `sglang.Engine` gets, ports for DP attention, and the
spec handed to the scheduler processes (runs in the caller, before any engine starts)."""

from __future__ import annotations

import logging
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional, Sequence

from hsdump.capture.families import LAYER_FLAG_CAPTURE
from hsdump.capture.layers import ModelInfo
from hsdump.capture.nodes import (
    KEY_FILE,
    NodeLayout,
    find_layout,
)
from hsdump.errors import Refusal

if TYPE_CHECKING:
    from hsdump.config import EngineConfig, ModelConfig
from hsdump.capture.patch import prepare_process

log = logging.getLogger(__name__)

SUPPORTED_SGLANG = ("0.5.17", "0.5.23")


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
        raise RuntimeError(
            f"sglang {version} is not supported; hsdump supports "
            f"{', '.join(SUPPORTED_SGLANG)} (pip install sglang==0.5.23)"
        )
    extra = engine_cfg.extra
    if extra.get("disable_radix_cache") is False:
        raise Refusal(
            "engine.extra.disable_radix_cache=false: a prefix-cache hit computes "
            "only the uncached suffix, so rows go missing. Remove the override."
        )
    if int(extra.get("pp_size", 1)) != 1:
        raise Refusal(
            "engine.extra.pp_size must be 1: aux capture sees only the last "
            "pipeline rank's layers. Use model.tp_size instead."
        )
    for key in ("speculative_algorithm", "speculative_draft_model_path", "enable_mixed_chunk"):
        if extra.get(key):
            raise Refusal(f"engine.extra.{key} is not supported by hsdump's capture; remove it")
    check_layout(extra)
    prepare_process(engine_cfg.device)
    from sglang.srt.models.registry import ModelRegistry

    try:
        cls, _ = ModelRegistry.resolve_model_cls([info.architecture])
    except Exception as e:  # SGLang raises ValueError with its own list
        raise Refusal(f"SGLang has no model class for {info.architecture}: {e}") from e
    # by the class SGLang resolved (its transformers fallback class is no flag-capture class)
    if not hasattr(cls, "set_eagle3_layers_to_capture") and cls.__name__ not in LAYER_FLAG_CAPTURE:
        raise Refusal(
            f"{info.architecture} ({cls.__name__}) has no EAGLE-3 aux capture in "
            f"sglang {version}; hsdump cannot capture its layers. The classes "
            'hsdump verified: README "Model families" (hsdump.capture.families)'
        )
    return version


# Parallel layouts whose rows were checked against transformers through extract.py on two
# H200s (SGLang 0.5.17, DeepSeek-V3 architecture; docs/scaling.md, "Serving layouts"): model.tp_size=N
# alone; with +engine.extra.dp_size=N +engine.extra.enable_dp_attention=true; with
# +engine.extra.ep_size=N (default moe_a2a_backend=none). dp_size without DP attention
# (replicas) was checked on Llama.
WORKING_LAYOUTS = (
    "model.tp_size=N +engine.extra.dp_size=N "
    "+engine.extra.enable_dp_attention=true (DP attention), or model.tp_size=N "
    "+engine.extra.ep_size=N (expert parallelism with the default "
    "moe_a2a_backend=none), or model.tp_size=N alone"
)


def check_layout(extra: dict) -> None:
    """Refuse, before the engine starts, parallel layouts whose rows hsdump cannot deliver
    exactly or has not verified; each message names layouts that work."""
    a2a = extra.get("moe_a2a_backend")
    if a2a not in (None, "none"):
        raise Refusal(
            f"engine.extra.moe_a2a_backend={a2a}: hsdump's capture is not verified with an MoE "
            "all-to-all backend (deepep, mooncake, nixl, mori, pplx, flashinfer, ... need "
            "packages or an NVLink fabric that hsdump's test machines lack). Remove it: expert "
            "parallelism works with the default backend. Use " + WORKING_LAYOUTS
        )
    if extra.get("enable_two_batch_overlap"):
        raise Refusal(
            "engine.extra.enable_two_batch_overlap=true: SGLang runs the overlapped layers "
            "outside the loop that captures EAGLE-3 aux states, so captured layers go missing. "
            "Remove it; use " + WORKING_LAYOUTS
        )
    if int(extra.get("attn_cp_size") or 1) != 1:
        raise Refusal(
            f"engine.extra.attn_cp_size={extra['attn_cp_size']}: context parallelism splits "
            "each request's tokens across ranks, and SGLang does not gather the captured aux "
            "states back. Remove it; use " + WORKING_LAYOUTS
        )


def start_kwargs(c: "EngineConfig", generates: bool) -> dict:
    """SGLang's start-time settings for a run on the GPU: decode CUDA graphs only for a run that
    decodes, prefill graphs up to engine.prefill_cuda_graph_max_tokens (docs/performance.md,
    "Engine start"), FlashInfer's all-reduce fusion (and its JIT build) only if asked for, and a forward
    time limit that leaves room for the first forward's JIT (engine.watchdog_timeout)."""
    if c.device != "cuda":
        return {}
    kw = (
        {}
        if c.flashinfer_allreduce_fusion
        else {"enforce_disable_flashinfer_allreduce_fusion": True}
    )
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
    if (
        not kw.get("enable_dp_attention")
        or "port" in kw
        or kw.get("dist_init_addr")
        or kw.get("nnodes", 1) > 1
    ):
        return None
    import random

    from sglang.srt.utils.network import is_port_available

    offsets = dp_attention_offsets()
    starts = list(range(30000, 40000, 100))
    (rng or random.Random()).shuffle(starts)  # two jobs starting together rarely pick the same
    for port in starts:
        if all(is_port_available(port + d) for d in offsets):
            return port
    raise RuntimeError(
        "DP attention: no free TCP ports found in 30233-40240 for SGLang's "
        "engine; give one with +engine.extra.port=<free port>"
    )


def plain_kwargs(c: "EngineConfig", model_path: str, model_cfg: "ModelConfig") -> dict:
    """sglang.Engine's keyword arguments of hsdump's engine settings, with nothing of capture
    (engine_kwargs adds that; the benchmarks start SGLang's plain engine with these)."""
    kw = dict(
        model_path=model_path,
        tp_size=model_cfg.tp_size,
        dtype=model_cfg.dtype,
        device=c.device,
        skip_tokenizer_init=True,
        disable_radix_cache=True,
        chunked_prefill_size=c.chunked_prefill_size,
        max_prefill_tokens=c.max_prefill_tokens,
        disable_cuda_graph=c.disable_cuda_graph,
        trust_remote_code=model_cfg.trust_remote_code,
        log_level=c.log_level,
    )
    for key in (
        "attention_backend",
        "sampling_backend",
        "mem_fraction_static",
        "max_running_requests",
        "max_total_tokens",
    ):
        if getattr(c, key) is not None:
            kw[key] = getattr(c, key)
    return kw


def engine_kwargs(
    c: "EngineConfig",
    model_path: str,
    model_cfg: "ModelConfig",
    version: str,
    layers: Sequence[int],
    generates: bool,
    family,
    layout: NodeLayout,
) -> dict:
    """sglang.Engine's keyword arguments for hsdump's capture (and for the other nodes of an
    engine over several nodes, which start the same engine with their node_rank)."""
    kw = plain_kwargs(c, model_path, model_cfg)
    kw["enable_return_hidden_states"] = True
    # text only: a vision-language checkpoint (KimiK25ForConditionalGeneration, ...) loads
    # no image processor and runs no vision forward (its vision weights still load)
    kw["enable_multimodal"] = False
    if version != "0.5.17":
        # capture-only mode: aux capture with no draft model (the patch then sets the layers)
        kw.update(
            speculative_algorithm="EAGLE3",
            enable_return_aux_hidden_states=True,
            return_aux_hidden_state_layer_ids=[k - 1 for k in sorted(layers)],
        )
    kw.update(start_kwargs(c, generates))
    if layout.multi:
        kw.update(
            nnodes=layout.nnodes, node_rank=layout.node_rank, dist_init_addr=layout.dist_init_addr
        )
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
        raise Refusal(
            "an engine over several nodes hands its row keys over in the output "
            "folder: give CaptureEngine run_dir"
        )
    name = KEY_FILE if not job_tag else KEY_FILE.replace(".json", f"-{job_tag}.json")
    return Path(run_dir) / name


def scheduler_spec(
    rows_spec: dict, layout: NodeLayout, layers, final, device: str, slots: int, hidden: int, family
) -> dict:
    """What every scheduler process of this node reads from the HSDUMP_CAPTURE variable."""
    return {
        "rows": rows_spec,
        "node_rank": layout.node_rank,
        "layers": list(layers),
        "final": list(final),
        "device": device,
        "slots": slots,
        "hidden": hidden,
        "tap_input_norm": bool(family and family.tap_input_norm),
    }
