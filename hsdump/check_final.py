"""The in-run final-state check (`check.logprob_samples=N`), for models too big for `hsdump check`.

For the first N samples a run captures, SGLang's own logprob of each input token (a second
request per sample, `return_logprob` from position 0) is compared with the next-token loss
computed from the captured final state as the dataset stores it, through the checkpoint's LM head
(and, for pre_norm, its final norm) read straight from its safetensors: the model is never
loaded. Rule 5 of hsdump.check judges it. The result is logged and written to
`OUT/final_check/<writer>.json` (docs/format.md, "Side files"). Nothing here imports sglang:
the engine hands over the logprobs (hsdump.capture.engine.CaptureEngine.input_logprobs).
"""

from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from hsdump.check import LOGPROB_EPS, Head, logprob_loss_ok
from hsdump.errors import MissingInput, Refusal

log = logging.getLogger(__name__)

FORMAT = "hsdump/final_check"
FOLDER = "final_check"
EPS_KEYS = ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps")
NOT_TEXT = ("vision", "visual", "mm_projector", "multi_modal", "audio", "mtp")
NORM_RE = re.compile(r"(^|\.)(norm|final_layernorm|ln_f|final_norm)\.weight$")


def _weight_files(folder: Path) -> Dict[str, Path]:
    """{tensor name: safetensors file} of a checkpoint folder."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        wm = json.loads(index.read_text())["weight_map"]
        return {k: folder / v for k, v in wm.items()}
    from safetensors import safe_open

    out: Dict[str, Path] = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), "pt") as h:
            out.update({k: f for k in h.keys()})
    if not out:
        raise MissingInput(f"{folder} holds no safetensors weights")
    return out


def _pick(names, pattern: re.Pattern) -> Optional[str]:
    """The shortest (outermost) matching name outside the decoder layers and any non-text tower."""
    cands = [
        n
        for n in names
        if pattern.search(n) and ".layers." not in n and not any(w in n for w in NOT_TEXT)
    ]
    return min(cands, key=lambda n: (n.count("."), n)) if cands else None


class RMSNorm:
    """The final norm as the checkpoint's config describes it, in float32: RMSNorm (Gemma's
    scales by 1 + weight) or, where the checkpoint has a bias beside it, LayerNorm."""

    def __init__(self, weight, eps: float, plus_one: bool = False, bias=None):
        self.weight, self.eps, self.plus_one, self.bias = weight, eps, plus_one, bias

    def __call__(self, x):
        import torch

        x = x.float()
        w = self.weight + 1.0 if self.plus_one else self.weight
        if self.bias is not None:
            return torch.nn.functional.layer_norm(x, x.shape[-1:], w, self.bias, self.eps)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w


def head_names(model_path: str) -> Tuple[Dict[str, Path], str, str, dict]:
    """({tensor name: file}, the LM head's name, the final norm's name, the text config) of the
    checkpoint at `model_path`, from the safetensors headers alone: a Refusal, before the engine
    starts, when either is missing or stored quantized."""
    from safetensors import safe_open

    folder = Path(model_path)
    cfg = json.loads((folder / "config.json").read_text())
    text = {**cfg, **(cfg.get("text_config") or {})}
    files = _weight_files(folder)
    head = _pick(files, re.compile(r"(^|\.)lm_head\.weight$"))
    if head is None and text.get("tie_word_embeddings") in (True, None):
        head = _pick(files, re.compile(r"(^|\.)embed_tokens\.weight$"))
    norm = _pick(files, NORM_RE)
    if head is None or norm is None:
        raise Refusal(
            f"{folder}: no {'LM head' if head is None else 'final norm'} weight found by name "
            "(lm_head.weight / tied embed_tokens.weight, norm.weight); check.logprob_samples "
            "cannot check this checkpoint: set it to 0 and use `hsdump check`"
        )
    for name in (head, norm):
        with safe_open(str(files[name]), "pt") as h:
            dtype = h.get_slice(name).get_dtype()
        if dtype not in ("F32", "BF16", "F16"):
            raise Refusal(
                f"{folder}: {name} is stored as {dtype} (quantized): check.logprob_samples "
                "needs a plain LM head and norm; set it to 0"
            )
    return files, head, norm, text


def checkpoint_head(model_path: str) -> Tuple[Head, Dict[str, object]]:
    """The LM head and final norm of the checkpoint at `model_path`, read from its safetensors
    (float32), and what was read: {"lm_head", "norm", "eps", "plus_one", "softcap"}."""
    from safetensors import safe_open

    files, head, norm, text = head_names(model_path)

    def read(name):
        with safe_open(str(files[name]), "pt") as h:
            return h.get_tensor(name).float()

    bias_name = norm[: -len("weight")] + "bias"
    eps = next((float(text[k]) for k in EPS_KEYS if text.get(k) is not None), 1e-6)
    plus_one = str(text.get("model_type") or "").startswith("gemma")
    cap = text.get("final_logit_softcapping")
    fn = RMSNorm(read(norm), eps, plus_one, read(bias_name) if bias_name in files else None)
    facts = {"lm_head": head, "norm": norm, "eps": eps, "plus_one": plus_one, "softcap": cap}
    return Head(read(head), fn, float(cap) if cap else None), facts


def token_logprobs(head: Head, state, kind: str, input_ids, chunk: int = 1024) -> List[float]:
    """The logprob of input token t + 1 given the captured state at t, for every t, in chunks of
    tokens (a [chunk, vocab] float32 block at a time)."""
    import torch

    ids = torch.as_tensor(input_ids).long()
    out: List[float] = []
    for s in range(0, len(ids) - 1, chunk):
        e = min(s + chunk, len(ids) - 1)
        lp = torch.log_softmax(head.logits(state[s:e], kind), dim=-1)
        out += lp.gather(1, ids[s + 1 : e + 1, None])[:, 0].tolist()
    return out


def compare(
    head: Head, kind: str, rec: dict, engine_lps: Sequence[Optional[float]]
) -> Dict[str, object]:
    """One sample: the loss from its captured final state against the engine's."""
    ids = rec["input_ids"].tolist()
    mine = token_logprobs(head, rec["final"][kind], kind, ids)
    theirs = [x for x in engine_lps[1:]]
    if len(theirs) != len(mine) or any(x is None for x in theirs):
        return {"id": rec["id"], "tokens": len(ids), "ok": False, "problem": "logprobs missing"}
    loss, eloss = -sum(mine) / max(len(mine), 1), -sum(theirs) / max(len(theirs), 1)
    diff = max((abs(a - b) for a, b in zip(mine, theirs)), default=0.0)
    ok = logprob_loss_ok(loss, eloss) and math.isfinite(loss)
    return {
        "id": rec["id"],
        "tokens": len(ids),
        "loss": round(loss, 5),
        "engine_loss": round(eloss, 5),
        "max_token_diff": round(diff, 5),
        "ok": ok,
    }


def engine_logprobs(engine, first, on_signal=None) -> Dict[int, List[Optional[float]]]:
    """SGLang's input-token logprobs of `first` ([(sample id, input_ids)]), asked of the running
    engine; {} (logged) where the engine has none (engine=dry) or the request failed: the check
    is then skipped, the run goes on."""
    from hsdump.capture.base import EngineDied

    if not hasattr(engine, "input_logprobs"):
        log.warning("check.logprob_samples: this engine (engine=dry) has no logprobs: skipped")
        return {}
    try:
        return engine.input_logprobs(first, on_signal)
    except EngineDied:
        raise
    except Exception as e:  # the check's own request: the captured data stays good
        log.error("check.logprob_samples: SGLang's logprobs could not be had: %r", e)
        return {}


def report(
    out_dir: str, writer: str, model_path: str, logprobs: Dict[int, List[Optional[float]]]
) -> Optional[dict]:
    """Judge the samples of `logprobs` ({sample id: SGLang's input-token logprobs}) as the
    dataset at `out_dir` stores them, log the verdict and write final_check/<writer>.json.
    Samples the writer did not commit (refused) are left out."""
    from hsdump.store.reader import HsdumpDataset

    ds = HsdumpDataset(out_dir)
    try:
        kinds = ds.final_kinds
        sids = sorted(s for s in logprobs if s in ds)
        recs = [ds.get(s) for s in sids]
    finally:
        ds.close()
    if not recs or not kinds:
        log.warning("check.logprob_samples: no committed sample with a final state to check")
        return None
    from hsdump.store.commits import writer_name

    writer = writer_name(writer)
    kind = kinds[0]
    try:
        head, facts = checkpoint_head(model_path)
    except (Refusal, OSError) as e:  # refused before the engine started, unless it changed since
        log.error("check.logprob_samples: the checkpoint's LM head could not be read: %s", e)
        return None
    samples = [compare(head, kind, r, logprobs[r["id"]]) for r in recs]
    res = {
        "format": FORMAT,
        "version": 1,
        "writer": writer,
        "final": kind,
        "head": facts,
        "tolerance": LOGPROB_EPS,
        "samples": samples,
        "ok": all(s["ok"] for s in samples),
    }
    path = Path(out_dir) / FOLDER / f"{writer}.json"  # writer_name: "main" for a single job
    path.parent.mkdir(exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(res, indent=1) + "\n")
    tmp.replace(path)
    line = "; ".join(
        f"sample {s['id']}: {s.get('loss', float('nan')):.4f} vs {s.get('engine_loss', float('nan')):.4f}"
        for s in samples
    )
    (log.info if res["ok"] else log.error)(
        "final-state check (final/%s + the checkpoint's LM head against SGLang's logprobs, loss "
        "per token): %s -> %s (%s)",
        kind,
        line,
        "ok" if res["ok"] else f"FAILED (allowed difference {LOGPROB_EPS})",
        path,
    )
    return res
