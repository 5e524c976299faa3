"""What SGLang captured for a hyper-connection (mHC) model, against transformers, on the CPU.

GLM-5-next (Glm5NextForConditionalGeneration) keeps `hc_mult` residual streams per token:
transformers' `hidden_states[k]` is [T, hc_mult, H], while SGLang's EAGLE-3 capture hands on one
row of H per token. families_probe.py compares shapes and so cannot say which reduction SGLang
took. This script reads a dataset hsdump wrote (on the GPU: SGLang's GLM-5-next does not run on
the CPU) and, per sample and captured layer k, prints the relative error of the captured rows
against each candidate built from transformers float32 on the same checkpoint:

  mean     the unweighted mean of the streams (what SGLang's DFLASH capture and transformers'
           final `hc_head` take)
  s0..sN   one stream
  pre      the layer's own collapse (`layers[k].attn_hc`), the attention block's input
  plain    the same weights with every hyper-connection replaced by a plain residual
           (collapse = mean of identical streams, post = 1, comb = I: h + block(norm(h))), which
           is what SGLang 0.5.23 builds when the checkpoint's text_config lacks `mhc: true`
           (sglang/srt/configs/glm5_next.py defaults it to false and the loader then drops the
           hc_* weights)
  bf16     transformers bf16's stream mean against float32's: the noise floor

    .venv/bin/python bench/mhc_rows.py --dataset /tmp/g5/ds-glm5_next \
        --checkpoint ~/.cache/hsdump/families/glm5_next [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from tolerance import rel_err  # noqa: E402


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return round(rel_err(a, b), 4)


def plain_hc(self, streams):  # replaces Glm5NextTextHyperConnection.forward for `plain`
    b, t, n, _ = streams.shape
    post = torch.ones(b, t, n, dtype=torch.float32)
    comb = torch.eye(n, dtype=torch.float32).expand(b, t, n, n)
    return post, comb, streams.mean(2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    import transformers

    from hsdump.store.reader import HsdumpDataset

    ds = HsdumpDataset(args.dataset)
    records = {sid: ds.get(sid) for sid in ds.ids}
    layers = list(ds.layers)
    cfg = transformers.AutoConfig.from_pretrained(args.checkpoint)
    cls = getattr(transformers, cfg.architectures[0])
    m32 = cls.from_pretrained(args.checkpoint, dtype=torch.float32).eval()
    m16 = cls.from_pretrained(args.checkpoint, dtype=torch.bfloat16).eval()
    text = m32.model.language_model if hasattr(m32.model, "language_model") else m32.model
    rows = []
    hc = type(text.layers[0].attn_hc)
    mhc_forward = hc.forward
    print(
        f"{'sample':>6} {'layer':>5} {'T':>4} {'mean':>7} {'pre':>7} {'best s':>7} "
        f"{'plain':>7} {'bf16':>7}"
    )
    for sid in sorted(records):
        ids = records[sid]["input_ids"].unsqueeze(0)
        with torch.no_grad():
            a = m32(input_ids=ids, output_hidden_states=True).hidden_states
            b = m16(input_ids=ids, output_hidden_states=True).hidden_states
            try:
                hc.forward = plain_hc
                p = m32(input_ids=ids, output_hidden_states=True).hidden_states
            finally:
                hc.forward = mhc_forward
        for j, k in enumerate(layers):
            h = records[sid]["hidden_states"][j]
            ref = a[k][0]
            if ref.dim() != 3:
                print(f"layer {k}: transformers' rows are {tuple(ref.shape)}, not [T, streams, H]")
                return 2
            with torch.no_grad():
                pre = text.layers[k].attn_hc(a[k])[2][0]
            r = {
                "sample": sid,
                "layer": k,
                "tokens": ref.shape[0],
                "mean": rel(h, ref.mean(1)),
                "pre": rel(h, pre),
                "streams": [rel(h, ref[:, s]) for s in range(ref.shape[1])],
                "plain": rel(h, p[k][0].mean(1)),
                "bf16": rel(b[k][0].mean(1), ref.mean(1)),
            }
            rows.append(r)
            print(
                f"{sid:>6} {k:>5} {r['tokens']:>4} {r['mean']:>7} {r['pre']:>7} "
                f"{min(r['streams']):>7} {r['plain']:>7} {r['bf16']:>7}"
            )
    ds.close()
    if args.out:
        Path(args.out).write_text(json.dumps({"layers": layers, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
