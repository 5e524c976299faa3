"""Does hsdump's layer list survive SGLang 0.5.23's second setter call? (CPU engine)

tests/test_layer_override.py runs this script.

With `enable_return_aux_hidden_states`, SGLang 0.5.23 calls `set_eagle3_layers_to_capture(ids)`
again in `ModelRunner.init_attention_backends` (configure_aux_hidden_state_capture), after
hsdump's patch set `layers_to_capture` in `load_model`. Llama's setter adds 1 to every id, which
gives hsdump's list back; deepseek_v2.py's (DeepSeek-V2/V3, Kimi-K2.5, and glm4_moe_lite.py's)
adds 1 only when the first id is 1. MLA does not run on SGLang's CPU engine, so this check gives
the tiny Llama's setter DeepSeek's rule (`--deepseek-rule`), captures layers [1, 3, 4] through
hsdump's CaptureEngine, and reports which transformers float32 `hidden_states[i]` each stored
layer matches (exit status 1 when one is shifted). The log's `after_init_attention_backends`
is SGLang's list after its own setter call, before hsdump's patch sets its list again (commit
032f2ae); `--fix` also sets it inside this check's wrapper (for a patch without 032f2ae).

    .venv/bin/python tests/layer_override_check.py --deepseek-rule

Measured 2026-12-01 (SGLang 0.5.23, CPU), layers [1, 3, 4]: before 032f2ae they matched
transformers' hidden_states 0, 2, 3 (error 0.0000, 0.0038, 0.0045; 0.43-0.52 at the asked
index); with 032f2ae (and with --fix before it) 1, 3, 4 (0.0028, 0.0045, 0.0050). SGLang's own
list read [0, 2, 3] after its second setter call in both runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOG_ENV = "HSDUMP_OVERRIDE_CHECK_LOG"


def _log(**k) -> None:
    with open(os.environ[LOG_ENV], "a") as f:
        f.write(json.dumps(k) + "\n")


def run_scheduler_process(*args, **kwargs):
    """hsdump's scheduler entry, with the setter logged (and given DeepSeek's id rule)."""
    from sglang.srt.model_executor import model_runner as mr
    from sglang.srt.models import llama

    from hsdump.capture import patch

    orig_set = llama.LlamaForCausalLM.set_eagle3_layers_to_capture

    def set_eagle3(self, layer_ids=None):
        where = [f"{f.name}:{f.lineno}" for f in traceback.extract_stack()[-4:-1]]
        out = orig_set(self, layer_ids)
        if os.environ.get("HSDUMP_OVERRIDE_DEEPSEEK_RULE") and layer_ids and layer_ids[0] != 1:
            self.model.layers_to_capture = list(layer_ids)  # deepseek_v2.py's rule
        _log(event="set_eagle3", ids=layer_ids, now=list(self.model.layers_to_capture), at=where)
        return out

    llama.LlamaForCausalLM.set_eagle3_layers_to_capture = set_eagle3
    layers = sorted(json.loads(os.environ[patch.ENV])["layers"])
    orig_iab = mr.ModelRunner.init_attention_backends

    def init_attention_backends(self, *a, **k):
        out = orig_iab(self, *a, **k)
        stack = patch.decoder_stack(self.model)
        if os.environ.get("HSDUMP_OVERRIDE_FIX"):
            stack.layers_to_capture = list(layers)
        _log(event="after_init_attention_backends", layers_to_capture=list(stack.layers_to_capture))
        return out

    mr.ModelRunner.init_attention_backends = init_attention_backends
    return patch.run_scheduler_process(*args, **kwargs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--deepseek-rule", action="store_true")
    ap.add_argument("--fix", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    # the scheduler processes import this module by name
    os.environ["PYTHONPATH"] = ":".join(
        [str(HERE)] + [p for p in os.environ.get("PYTHONPATH", "").split(":") if p]
    )
    log = Path("/tmp") / f"hsdump-override-check-{os.getpid()}.jsonl"
    os.environ[LOG_ENV] = str(log)
    if args.deepseek_rule:
        os.environ["HSDUMP_OVERRIDE_DEEPSEEK_RULE"] = "1"
    if args.fix:
        os.environ["HSDUMP_OVERRIDE_FIX"] = "1"
    import layer_override_check as me
    import torch
    from transformers import AutoModelForCausalLM

    import hsdump.capture.engine as he
    from hsdump.capture.base import Request
    from hsdump.capture.start import engine_preset, start
    from hsdump.tiny import resolve_model_path

    he.run_scheduler_process = me.run_scheduler_process  # CaptureEngine's class picks it up
    mp = resolve_model_path("tiny:llama")
    layers = [1, 3, 4]
    ids = list(range(10, 50))
    got = {}
    with start(mp, layers, engine_preset("cpu")) as eng:
        eng.run([Request(0, ids)], lambda s: got.setdefault(s.sid, [h.float() for h in s.rows]))
    m = AutoModelForCausalLM.from_pretrained(mp, dtype=torch.float32)
    with torch.no_grad():
        ref = m(torch.tensor([ids]), output_hidden_states=True).hidden_states
    res = {"deepseek_rule": args.deepseek_rule, "fix": args.fix, "layers": {}}
    for j, k in enumerate(layers):
        errs = [float((got[0][j] - r[0]).norm() / r[0].norm()) for r in ref]
        best = min(range(len(errs)), key=errs.__getitem__)
        res["layers"][k] = {"best_hf_index": best, "err_at_k": errs[k], "err_best": errs[best]}
    res["calls"] = [json.loads(line) for line in log.read_text().splitlines()]
    log.unlink()
    print(json.dumps(res, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    ok = all(r["best_hf_index"] == int(k) for k, r in res["layers"].items())
    print("layers right" if ok else "layers SHIFTED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
