"""fp8 storage (hsdump.store.fp8): bytes per sample and the error against bf16, on Gaussian and
heavy-tailed activations (2000x outlier channels) and, with --tiny PATH, on a model's hidden
states through transformers.

    .venv/bin/python bench/fp8_error.py [--seq 2048 --hidden 4096 --layers 3] [--tiny PATH]
"""

import sys

import torch

from hsdump.store.fp8 import error_report, heavy_tailed  # noqa: E402


def main(argv=None) -> int:
    import argparse
    import json

    p = argparse.ArgumentParser(
        prog="bench/fp8_error.py", description="fp8 storage: bytes per sample and error vs bf16"
    )
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument(
        "--tiny",
        default=None,
        help="also hidden states of this model path "
        "(e.g. the tiny:llama folder) through transformers",
    )
    a = p.parse_args(argv)
    n, h, k = a.seq, a.hidden, a.layers
    bf16_bytes = n * 16 + k * n * h * 2
    fp8_bytes = n * 16 + k * (n * h + 4 * n)
    print(
        json.dumps(
            {
                "bytes_per_sample": {
                    "shape": [n, k, h],
                    "bf16": bf16_bytes,
                    "fp8": fp8_bytes,
                    "ratio": round(fp8_bytes / bf16_bytes, 4),
                }
            }
        )
    )
    cases = {
        "gaussian": torch.randn(n, h, generator=torch.Generator().manual_seed(0)),
        "heavy_tailed": heavy_tailed(n, h),
    }
    for name, x in cases.items():
        massive = [1512 % h, 2401 % h] if name == "heavy_tailed" else None
        r = error_report(x, massive)
        print(json.dumps({name: {k2: round(v, 5) for k2, v in r.items()}}))
    if a.tiny:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(a.tiny, dtype=torch.float32).eval()
        ids = torch.randint(
            2,
            model.config.vocab_size,
            (1, min(n, 1024)),
            generator=torch.Generator().manual_seed(0),
        )
        with torch.no_grad():
            hs = model(ids, output_hidden_states=True).hidden_states
        L = len(hs) - 1
        for layer in sorted({2, L // 2, L - 3, L}):
            r = error_report(hs[layer][0])
            print(json.dumps({f"tiny layer {layer}": {k2: round(v, 5) for k2, v in r.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
