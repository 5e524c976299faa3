"""The drafter kinds SGLang serves and SpecForge 0.2.0 trains (EAGLE-3, DFlash, DSpark): their
recipes' shapes and training settings, and each drafter's config on the target's dimensions with
hsdump's serving ids (`python3 -m bench.acceptance draft-config`)."""

from __future__ import annotations

import json
from pathlib import Path

from .target import mask_token_id

KINDS = ("dflash", "eagle3", "dspark")  # run order: by value
ALGORITHM = {"eagle3": "EAGLE3", "dflash": "DFLASH", "dspark": "DSPARK"}
EXPORT_TO = {"eagle3": "sglang", "dflash": "hf", "dspark": "hf"}
SERVED_STEPS = 3  # EAGLE-3's speculative_num_steps (serve.SPEC)


# SpecForge's recipes (sgl-project/SpecForge at the 0.2.0 release line):
#  EAGLE-3: its generated draft (one Llama layer, draft vocabulary 32000) and
#   examples/configs/llama3.1-8b-eagle3-offline.yaml (lr 1e-4, grad norm 0.5, ttt 7, sdpa);
#  DFlash: configs/qwen3-8b-dflash.json (a Qwen3 draft of 5 layers, block 16);
#  DSpark: configs/qwen3-8b-dspark.json (the same + Markov head rank 256, confidence head) and
#   examples/configs/online/colocated/qwen3-8b-dspark-colocated.yaml (lr 6e-4, warm-up 0.04,
#   grad norm 1.0, 512 anchors, loss decay 4.0), used for DFlash as well.
DRAFT_LAYERS = {"eagle3": 1, "dflash": 5, "dspark": 5}
BLOCK_SIZE = 16
DSPARK_HEAD = dict(
    projector_type="dspark",
    markov_rank=256,
    markov_head_type="vanilla",
    confidence_head_alpha=1.0,
    enable_confidence_head=True,
    confidence_head_with_markov=True,
)
TRAINING = {
    "eagle3": dict(learning_rate=1e-4, max_grad_norm=0.5, ttt_length=7, warmup_ratio=0.015),
    "dflash": dict(learning_rate=6e-4, max_grad_norm=1.0, warmup_ratio=0.04, num_anchors=512,
                   loss_decay_gamma=4.0),
    "dspark": dict(learning_rate=6e-4, max_grad_norm=1.0, warmup_ratio=0.04, num_anchors=512,
                   loss_decay_gamma=4.0),
}  # fmt: skip


DRAFT_ARCH = {"eagle3": "LlamaForCausalLMEagle3", "dflash": "DFlashDraftModel",
              "dspark": "DSparkDraftModel"}  # fmt: skip


def draft_config(kind: str, target: str, serving_ids, block_size: int = BLOCK_SIZE,
                 fc_norm: bool = False, norm_before_fc: bool = False,
                 feed_post_norm: bool = False) -> dict:  # fmt: skip
    """The drafter's config: the recipe's shape on the target's dimensions, and the SGLang
    serving ids (`hsdump export` prints them) under the key SGLang's class reads. EAGLE-3's
    options, none in the recipe: `fc_norm`, an RMSNorm on each captured layer before the
    drafter's fc, which SpecForge 0.2.0 trains and SGLang 0.5.17 and 0.5.23 build from the
    same key; `norm_before_fc`, one RMSNorm over their concatenation (speculators' trainer's),
    and `feed_post_norm`, each draft step fed the previous step's normed state (speculators',
    served by SGLang's `norm_output`): SGLang builds both from these keys, SpecForge's drafter
    has them through patches/draft_options.py."""
    t = json.loads((Path(target) / "config.json").read_text())
    heads = int(t["num_attention_heads"])
    rope = t.get("rope_parameters") or {}
    base = dict(
        attention_bias=False,
        attention_dropout=0.0,
        bos_token_id=t.get("bos_token_id"),
        eos_token_id=t.get("eos_token_id"),
        pad_token_id=t.get("pad_token_id"),
        head_dim=int(t.get("head_dim") or t["hidden_size"] // heads),
        hidden_act=t.get("hidden_act", "silu"),
        hidden_size=int(t["hidden_size"]),
        initializer_range=0.02,
        intermediate_size=int(t["intermediate_size"]),
        max_position_embeddings=int(t["max_position_embeddings"]),
        num_attention_heads=heads,
        num_key_value_heads=int(t.get("num_key_value_heads", heads)),
        num_hidden_layers=DRAFT_LAYERS[kind],
        rms_norm_eps=float(t["rms_norm_eps"]),
        rope_theta=float(rope.get("rope_theta", t.get("rope_theta", 10000.0))),
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
        use_cache=True,
        vocab_size=int(t["vocab_size"]),
    )
    ids = [int(x) for x in serving_ids]
    if kind == "eagle3":
        return dict(
            architectures=[DRAFT_ARCH[kind]],
            model_type="llama",
            draft_vocab_size=min(32000, base["vocab_size"]),
            eagle_config=dict(eagle_aux_hidden_state_layer_ids=ids),
            **({"fc_norm": True} if fc_norm else {}),
            **({"norm_before_fc": True} if norm_before_fc else {}),
            **({"feed_post_norm": True, "norm_output": True} if feed_post_norm else {}),
            **base,
        )
    n = base["num_hidden_layers"]
    cfg = dict(
        architectures=[DRAFT_ARCH[kind]],
        model_type="qwen3",
        block_size=int(block_size),
        layer_types=["full_attention"] * n,
        max_window_layers=n,
        num_target_layers=int(t["num_hidden_layers"]),
        sliding_window=None,
        use_sliding_window=False,
        dflash_config=dict(
            target_layer_ids=ids, mask_token_id=mask_token_id(target, base["vocab_size"])
        ),
        **base,
    )
    if kind == "dspark":
        cfg["dflash_config"].update(DSPARK_HEAD)
        # SGLang 0.5.23's DSparkDraftModel builds its Markov and confidence heads from the
        # config's top level (models/dspark.py build_markov_head, build_confidence_head), SpecForge
        # 0.2.0 reads and exports them under dflash_config: both places, the same values
        cfg.update(DSPARK_HEAD)
    return cfg


def write_draft_config(kind, target, export, out, block_size: int = BLOCK_SIZE, **opts) -> list:
    """`draft_config` on an export's serving ids (the layers it holds) with the drafter options
    `opts`, written to `out` (its folder made): the ids."""
    ids = export_facts(export)["serving_ids"]
    cfg = draft_config(kind, target, ids, block_size, **opts)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(cfg, indent=1) + "\n")
    return ids


def export_facts(export: str) -> dict:
    return json.loads((Path(export) / "hsdump_export.json").read_text())


DRAFTER_FLAGS = {
    "fc_norm": "an RMSNorm per captured layer before fc",
    "norm_before_fc": "one RMSNorm over the concatenated captured layers before fc "
    "(speculators' trainer's)",
    "feed_post_norm": "each draft step fed the previous step's normed state (speculators' "
    "trainer's; served through SGLang's norm_output)",
}


def drafter_flags(p) -> None:
    for k, what in DRAFTER_FLAGS.items():
        p.add_argument("--" + k.replace("_", "-"), action="store_true", help=f"EAGLE-3: {what}")


def drafter_options(a) -> dict:
    """draft_config's EAGLE-3 options from draft-config's or run-all's flags (the other kinds'
    configs take none)."""
    return {k: getattr(a, k) for k in DRAFTER_FLAGS}
