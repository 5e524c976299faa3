"""Captured rows against transformers: the tolerance rules and the comparison, in one place.

`hsdump check OUT` (hsdump.tools.check), the in-run final-state check (hsdump.check_final), the
tests and the benchmarks all judge rows with these rules. Nothing here imports sglang; torch and
transformers are imported inside the functions.

Relative error of a sample and a layer is ||a - b|| / ||b|| over the whole [seq, hidden] tensor
(`rel_err`). The engine runs in bf16, transformers in float32 on the same bf16 weights; the scale
of what bf16 costs is transformers' own bf16 forward on the same inputs (its relative error
against float32), so no rule is a single fixed number:

1. Per sample (dense models): every sample's error at layer k
   <= PER_SAMPLE_FACTOR * scale + PER_SAMPLE_EPS. bf16 keeps 8 significant bits, so every
   matmul and norm rounds at ~2^-9 = 0.002 relative; through a few layers that accumulates to
   ~0.5%.

   The neighbour verdict (`neighbours`, every model): the rows are closest to index k of all
   the model's indices, and k is far enough from k - 1 and k + 1 that this cannot be chance:
   the model's own states at k and at k +- 1 are more than NEIGHBOUR_FACTOR = 2 times the
   rows' error apart, + NEIGHBOUR_EPS (`neighbours_apart`). Why 2: with e the rows' distance
   from index k and d the distance from k to k + 1, the triangle inequality puts the rows at
   least d - e > e from k + 1, so they are closest to k; and rows one layer off (index k + 1's
   with the same error e) are at least d - e > e from k, so they are closest to k + 1 and fail
   as `matches k + 1`. Nothing is assumed of how the error is spread (distances are relative
   to index k's norm; rows one layer off are taken to carry an error like these rows').
   Taken on the tokens after the first (`_after_sink`). The rule it replaces (the rows' error
   against k +- 1 above 5 x their own error + 0.01) failed right rows of a real 0.5B instruct
   model (Qwen2 class, 24 layers, hidden 896) on every short chat: own error 0.0174-0.022
   after the sink, neighbours 0.060-0.113 (d not recorded: about sqrt(0.060^2 - 0.022^2) =
   0.056 at the worst pairing, above 2 x 0.022 + 0.002 = 0.046; tests/test_neighbour_rule.py).

2. Mixture-of-experts models, per layer against transformers' own bf16 errors on the same
   prompts, TOL_EPS being absolute slack:
    a. mean over prompts of the captured error <= TOL_MEAN_FACTOR * mean of HF-bf16's error
       + TOL_EPS (catches systematic errors: adjacent layers of these models differ by
       0.54-4.1);
    b. every prompt's error <= TOL_FACTOR * the largest HF-bf16 error at that layer + TOL_EPS
       (catches one broken sample: lost or reordered chunks, rows of another request).
    c. the neighbour verdict as for dense models, and besides, the rows' error against k - 1
       and k + 1 is above b's bound (else rows one layer off would pass rule 2: an off-by-one
       could pass unseen). On an H200 a 7-token prompt of a DeepSeek-V3 model had 0.14-0.15
       against float32 (HF bf16: 0.09-0.11) and 0.51-0.67 against its neighbours, rows at the
       right index: both pass.
   Per-prompt ratios are not used: in an MoE a near-tied router flips experts for a few tokens
   in either bf16 run (on an H200 one 33-token prompt had 0.040 captured against 0.0078 HF
   bf16, while the other prompts had HF bf16 at or above the captured error).

3. Final states (capture.final): pre_norm / post_norm
   <= PER_SAMPLE_FACTOR * the last layer's scale + FINAL_EPS.

4. Next-token loss from a captured final state (post_norm: the LM head directly; pre_norm: the
   final norm, then the head) against transformers' float32 loss on the same tokens:
   |loss - loss_fp32| <= LOSS_FACTOR * |loss_bf16 - loss_fp32| + LOSS_EPS. On real weights
   massive activations (norms in the tens of thousands on a few tokens, in transformers' own
   bf16 forward alike) make the worst relative error alone misleading; the loss is the robust
   check.

5. In-run (`check.logprob_samples`): the loss from the captured final state and the
   checkpoint's own head against the loss from SGLang's input-token logprobs of the same
   tokens: |difference| <= LOGPROB_EPS (SGLang rounds its logits to bf16).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from hsdump.errors import Refusal

# 1. per sample (dense)
PER_SAMPLE_FACTOR = 3.0
PER_SAMPLE_EPS = 0.002
# the neighbour verdict: index k's states and k +- 1's more than 2 x the rows' error apart
NEIGHBOUR_FACTOR = 2.0
NEIGHBOUR_EPS = 0.002
# a failing layer "matches" index j when err_j <= 5 * bf16_err + 0.01
MATCH_FACTOR = 5.0
MATCH_EPS = 0.01

# 2. the MoE rule
TOL_MEAN_FACTOR = 2.0
TOL_FACTOR = 3.0
TOL_EPS = 0.005

# 3. final states
FINAL_EPS = 0.02

# 4. next-token loss (nats per token)
LOSS_FACTOR = 3.0
LOSS_EPS = 0.02

# 5. in-run: captured final state + the checkpoint's head against SGLang's logprobs
LOGPROB_EPS = 0.05

# a two-node dataset against the one-process TP 1 dataset, worst relative error per tensor
# (MoE in bf16; TP 2 against TP 1 measured within 0.08)
NODES_VS_TP1_MAX = 0.1

MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


# --------------------------------------------------------------------------- the rules
def rel_err(a, ref) -> float:
    """||a - ref|| / ||ref|| over the whole tensor, in float32."""
    a, ref = a.float(), ref.float()
    return float((a - ref).norm() / ref.norm())


def per_sample_ok(err: float, scale: float) -> bool:
    """Rule 1: one sample's error at one layer against transformers' bf16 error there."""
    return err <= PER_SAMPLE_FACTOR * scale + PER_SAMPLE_EPS


def neighbours_apart(apart: float, err: float) -> bool:
    """The neighbour verdict's margin: the model's own states at index k and at k +- 1 are
    `apart` (relative to index k's norm), the rows `err` from index k's; more than
    NEIGHBOUR_FACTOR * err + NEIGHBOUR_EPS apart, rows one layer off cannot be closest to k
    (the module's docstring, rule 1)."""
    return apart > NEIGHBOUR_FACTOR * err + NEIGHBOUR_EPS


def matches(err: float, scale: float) -> bool:
    """A row set "matches" an index when err <= MATCH_FACTOR * bf16 err + MATCH_EPS."""
    return err <= MATCH_FACTOR * scale + MATCH_EPS


def final_state_ok(err: float, last_layer_scale: float) -> bool:
    """Rule 3: a final state against transformers' float32 one."""
    return err <= PER_SAMPLE_FACTOR * last_layer_scale + FINAL_EPS


def loss_ok(loss: float, loss_fp32: float, loss_bf16: float) -> bool:
    """Rule 4: the next-token loss from a captured final state against transformers'."""
    return abs(loss - loss_fp32) <= LOSS_FACTOR * abs(loss_bf16 - loss_fp32) + LOSS_EPS


def logprob_loss_ok(loss: float, engine_loss: float) -> bool:
    """Rule 5: the loss from the captured final state against the engine's own."""
    return abs(loss - engine_loss) <= LOGPROB_EPS


def moe_tolerance(ref: Sequence[float], factor: float = TOL_FACTOR, eps: float = TOL_EPS) -> float:
    """Rule 2b's bound at one layer: the largest error a prompt's rows may have there."""
    return factor * max(ref) + eps


def moe_layer_failures(
    k,
    errs: Sequence[float],
    ref: Sequence[float],
    prompt_lens: Sequence[int],
    factor: float = TOL_FACTOR,
    mean_factor: float = TOL_MEAN_FACTOR,
    eps: float = TOL_EPS,
) -> List[str]:
    """Rule 2 at one layer: `errs` the captured errors per prompt, `ref` HF-bf16's; [] passes."""
    bad = []
    m_sgl, m_ref = sum(errs) / len(errs), sum(ref) / len(ref)
    if not m_sgl <= mean_factor * m_ref + eps:
        bad.append(
            f"layer {k}: mean sglang err {m_sgl:.4f} > {mean_factor} * mean "
            f"hf-bf16 err {m_ref:.4f} + {eps}"
        )
    for p, e in enumerate(errs):
        if not e <= moe_tolerance(ref, factor, eps):
            bad.append(
                f"layer {k}, prompt {p} (len {prompt_lens[p]}): sglang err "
                f"{e:.4f} > {factor} * max hf-bf16 err {max(ref):.4f} + {eps}"
            )
    return bad


def tolerance_failures(
    res: Dict,
    factor: float = TOL_FACTOR,
    mean_factor: float = TOL_MEAN_FACTOR,
    eps: float = TOL_EPS,
) -> List[str]:
    """Rule 2 over a result {"sglang_vs_hf_fp32": {layer: [err per prompt]},
    "hf_bf16_vs_hf_fp32": {layer: [...]}, "prompt_lens": [...], "problems": [...]}; an empty
    list means the case passes."""
    bad = list(res.get("problems", []))
    for k, errs in res.get("sglang_vs_hf_fp32", {}).items():
        bad += moe_layer_failures(
            k,
            errs,
            res["hf_bf16_vs_hf_fp32"][k],
            res.get("prompt_lens", []),
            factor,
            mean_factor,
            eps,
        )
    if not res.get("sglang_vs_hf_fp32"):
        bad.append("nothing was compared")
    return bad


def is_moe(config) -> bool:
    """A mixture-of-experts model (its config, or its text_config, names more than one expert):
    rule 2 instead of rule 1's per-sample bound."""
    for c in (config, getattr(config, "text_config", None)):
        if c is not None and any((getattr(c, k, None) or 0) > 1 for k in MOE_KEYS):
            return True
    return False


# --------------------------------------------------------------------------- losses
def token_loss(logits, input_ids) -> float:
    """Mean next-token cross-entropy (nats) of `logits` [seq, vocab] on `input_ids` [seq]:
    position t predicts token t + 1."""
    import torch

    ids = torch.as_tensor(input_ids).long().to(logits.device)
    if ids.numel() < 2:
        return float("nan")
    return float(torch.nn.functional.cross_entropy(logits[:-1].float(), ids[1:]))


def softcap(logits, cap: Optional[float]):
    """Gemma-2-style final logit softcapping (`final_logit_softcapping`); none when unset."""
    import torch

    return logits if not cap else torch.tanh(logits / cap) * cap


# --------------------------------------------------------------------------- transformers
def reference_model(path: str, dtype, device: str = "cpu", trust_remote_code: bool = False):
    """The checkpoint's own transformers class (config.json's architectures[0]; a
    vision-language wrapper then runs text-only), else AutoModelForCausalLM, in `dtype` on
    `device`, eval mode."""
    import transformers

    transformers.utils.logging.disable_progress_bar()
    config = transformers.AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    archs = getattr(config, "architectures", None) or []
    cls = getattr(transformers, archs[0], None) if archs else None
    cls = cls or transformers.AutoModelForCausalLM
    model = cls.from_pretrained(path, dtype=dtype, trust_remote_code=trust_remote_code)
    return model.to(device).eval()


def final_norm(model):
    """The model's final norm (the module between the last decoder layer and the head)."""
    dec = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    for name in ("norm", "final_layernorm", "ln_f", "final_norm"):
        m = getattr(dec, name, None)
        if m is not None:
            return m
    raise Refusal(f"{type(model).__name__}: no final norm found (norm, final_layernorm, ln_f)")


def logit_cap(config) -> Optional[float]:
    for c in (config, getattr(config, "text_config", None)):
        cap = getattr(c, "final_logit_softcapping", None) if c is not None else None
        if cap:
            return float(cap)
    return None


@dataclass
class Forward:
    """One prompt through transformers: its output_hidden_states (L + 1 tensors [seq, H],
    float32, CPU), the final norm's input (`pre_norm`), after it (`post_norm`) and the
    next-token loss of the model's own logits."""

    hidden_states: List
    pre_norm: object
    post_norm: object
    loss: float


def forward(model, input_ids, device: str) -> Forward:
    """`model` on one prompt, its final norm's input and output hooked."""
    import torch

    seen: Dict[str, object] = {}
    norm = final_norm(model)
    hook = norm.register_forward_hook(
        lambda m, a, out: seen.update(pre=a[0][0].float().cpu(), post=out[0].float().cpu())
    )
    try:
        with torch.no_grad():
            out = model(
                input_ids=torch.tensor([list(input_ids)], device=device),
                output_hidden_states=True,
                use_cache=False,
            )
    finally:
        hook.remove()
    return Forward(
        [h[0].float().cpu() for h in out.hidden_states],
        seen["pre"],
        seen["post"],
        token_loss(out.logits[0], input_ids),
    )


def hf_hidden_states(path, prompts, dtype=None, device: str = "cpu", cls: Optional[str] = None):
    """transformers' hidden_states (float32, CPU) per prompt: a list of L + 1 tensors [seq, H]
    for each prompt in `prompts` (lists of token ids), the model in `dtype` (default float32)
    on `device`; `cls` names the transformers class (default: the checkpoint's own)."""
    import torch
    import transformers

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dtype = torch.float32 if dtype is None else dtype
    if cls is None:
        model = reference_model(str(path), dtype, device)
    else:
        model = getattr(transformers, cls).from_pretrained(str(path), dtype=dtype)
        model = model.to(device).eval()
    out = []
    with torch.no_grad():
        for ids in prompts:
            res = model(
                input_ids=torch.tensor([list(ids)], device=device),
                output_hidden_states=True,
                use_cache=False,
            )
            out.append([h[0].float().cpu() for h in res.hidden_states])
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def reference(
    path: str, prompts, device: str = "cpu", trust_remote_code: bool = False
) -> Dict[str, List[Forward]]:
    """Every prompt through the checkpoint in float32, then (the same model cast: the
    checkpoint's bf16 weights are exact in float32) in bfloat16: {"fp32": [...], "bf16": [...]}.
    Also returns, under "moe", whether rule 2 applies, and under "head", the model's LM head
    and final norm (float32, CPU) with its logit softcap."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = reference_model(path, torch.float32, device, trust_remote_code)
    fp32 = [forward(model, ids, device) for ids in prompts]
    head = Head(
        model.get_output_embeddings().weight.detach().float().cpu().clone(),
        _norm_copy(final_norm(model)),
        logit_cap(model.config),
    )
    moe = is_moe(model.config)
    model.to(torch.bfloat16)
    bf16 = [forward(model, ids, device) for ids in prompts]
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"fp32": fp32, "bf16": bf16, "moe": moe, "head": head}


def _norm_copy(norm):
    import copy

    return copy.deepcopy(norm).float().cpu()


@dataclass
class Head:
    """What turns a final state into logits: the LM head's weight [vocab, H] and the final
    norm (a callable on [seq, H]; used for pre_norm states), both float32, and the softcap."""

    weight: object
    norm: object = None
    cap: Optional[float] = None

    def logits(self, state, kind: str):
        import torch

        x = state.float()
        if kind == "pre_norm":
            if self.norm is None:
                raise Refusal("no final norm to apply to a pre_norm state")
            with torch.no_grad():
                x = self.norm(x)
        return softcap(x @ self.weight.T, self.cap)

    def loss(self, state, kind: str, input_ids) -> float:
        return token_loss(self.logits(state, kind), input_ids)


# --------------------------------------------------------------------------- the comparison
@dataclass
class LayerResult:
    """One captured layer (capture index `index`) over the compared samples."""

    index: int
    err: List[float] = field(default_factory=list)  # per sample, against float32
    hf_bf16: List[float] = field(default_factory=list)  # transformers' own bf16, same sample
    own: List[float] = field(default_factory=list)  # against float32, the tokens after the first
    prev: List[Optional[float]] = field(default_factory=list)  # against index - 1, after it too
    next: List[Optional[float]] = field(default_factory=list)  # against index + 1, after it too
    apart: List[Optional[float]] = field(default_factory=list)  # model's k from its k +- 1
    best: List[int] = field(default_factory=list)  # the index it is closest to
    failures: List[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def neighbour(self) -> str:
        """ "right" when every sample is closest to its own index and far from both
        neighbours; else what it matches."""
        wrong = sorted({b for b in self.best if b != self.index})
        if wrong:
            return "matches " + ", ".join(str(b) for b in wrong)
        if any(f.startswith("neighbour") for f in self.failures):
            return "too close"
        return "right"

    def to_dict(self) -> dict:
        return {
            "index": self.index,
            "err": _r(self.err),
            "hf_bf16": _r(self.hf_bf16),
            "own": _r(self.own),
            "prev": _r(self.prev),
            "next": _r(self.next),
            "apart": _r(self.apart),
            "best": self.best,
            "neighbour": self.neighbour,
            "ok": self.ok,
            "failures": self.failures,
        }


@dataclass
class FinalResult:
    """One captured final state (`kind`: pre_norm, post_norm) over the compared samples."""

    kind: str
    err: List[float] = field(default_factory=list)
    hf_bf16: List[float] = field(default_factory=list)  # the last layer's bf16 scale
    loss: List[float] = field(default_factory=list)  # from the captured state
    loss_fp32: List[float] = field(default_factory=list)  # transformers' own
    loss_bf16: List[float] = field(default_factory=list)
    failures: List[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "err": _r(self.err),
            "hf_bf16": _r(self.hf_bf16),
            "loss": _r(self.loss),
            "loss_fp32": _r(self.loss_fp32),
            "loss_bf16": _r(self.loss_bf16),
            "ok": self.ok,
            "failures": self.failures,
        }


def _r(xs):
    return [
        None if x is None or (isinstance(x, float) and math.isnan(x)) else round(x, 5) for x in xs
    ]


def _after_sink(t):
    """The tokens after the first: position 0 of real models is an attention sink whose massive
    activation barely changes from layer to layer, so over the whole tensor adjacent layers
    can be within the neighbour rule's margin; the neighbour verdict is taken without it."""
    return t[1:] if t.shape[0] > 1 else t


@dataclass
class Neighbours:
    """The neighbour verdict of one sample's rows captured as index `index` (`neighbours`)."""

    index: int
    near: Dict[int, float]  # the rows' error against every index of the model (after the sink)
    apart: Dict[int, float]  # the model's own states: index k +- 1's distance from k's

    @property
    def own(self) -> float:
        return self.near[self.index]

    @property
    def best(self) -> int:
        """The index the rows are closest to."""
        return min(self.near, key=self.near.get)

    @property
    def too_close(self) -> List[int]:
        """The neighbours not `neighbours_apart` from index k by the rows' error."""
        return [o for o, d in self.apart.items() if not neighbours_apart(d, self.own)]

    @property
    def ok(self) -> bool:
        return self.best == self.index and not self.too_close

    def failures(self, where: str) -> List[str]:
        """What fails, as lines starting `where` (e.g. "layer 12, sample 3")."""
        if self.best != self.index:
            b = self.best
            return [
                f"{where}: its rows are index {b}'s, not {self.index}'s (err {self.near[b]:.4f} "
                f"against index {b}, {self.own:.4f} against {self.index})"
            ]
        return [
            f"neighbour: {where}: index {o} of the model is {self.apart[o]:.4f} from index "
            f"{self.index}, not more than {NEIGHBOUR_FACTOR} x the rows' error {self.own:.4f} "
            f"+ {NEIGHBOUR_EPS}: rows one layer off could be closest to {self.index} "
            "(an off-by-one could pass unseen)"
            for o in self.too_close
        ]


def neighbours(rows, states: Sequence, k: int) -> Neighbours:
    """The neighbour verdict of `rows` [seq, H] captured as index `k`, against `states`, the
    model's float32 hidden_states of the same prompt (index i = hidden_states[i]); taken on the
    tokens after the first (`_after_sink`). The one rule of `hsdump check`, the tests and the
    family probe."""
    h = _after_sink(rows.float())
    ref = [_after_sink(t.float()) for t in states]
    near = {i: rel_err(h, t) for i, t in enumerate(ref)}
    apart = {o: rel_err(ref[o], ref[k]) for o in (k - 1, k + 1) if 0 <= o < len(ref)}
    return Neighbours(k, near, apart)


def compare_layers(
    layers: Sequence[int], samples: Sequence[Dict], ref: Dict, moe: Optional[bool] = None
) -> List[LayerResult]:
    """The captured layers of `samples` (records as HsdumpDataset.get returns them, in the order
    of `ref`'s prompts) against `reference`'s forwards: rule 1 (rule 2 for an MoE model) and
    the neighbour verdict, per layer."""
    moe = ref.get("moe", False) if moe is None else moe
    out = []
    for j, k in enumerate(layers):
        r = LayerResult(k)
        moe_near = []  # (sample, neighbour index, error against it): MoE, judged per layer
        for p, rec in enumerate(samples):
            f32, f16 = ref["fp32"][p].hidden_states, ref["bf16"][p].hidden_states
            h = rec["hidden_states"][j].float()
            sid = rec.get("id", p)
            if not 0 <= k < len(f32) or h.shape != f32[k].shape:
                have = f"[{len(f32[0])}, {f32[0].shape[1]}] x {len(f32)} indices"
                r.failures.append(
                    f"layer {k}, sample {sid}: rows {list(h.shape)} have no counterpart in the "
                    f"model's hidden_states ({have}): another model, or a wrong manifest"
                )
                continue
            err, scale = rel_err(h, f32[k]), rel_err(f16[k], f32[k])
            r.err.append(err)
            r.hf_bf16.append(scale)
            nb = neighbours(h, f32, k)
            r.own.append(nb.own)
            r.prev.append(nb.near.get(k - 1))
            r.next.append(nb.near.get(k + 1))
            r.apart.append(min(nb.apart.values(), default=None))
            r.best.append(nb.best)
            if not moe and not per_sample_ok(err, scale):
                r.failures.append(
                    f"layer {k}, sample {sid}: err {err:.4f} > {PER_SAMPLE_FACTOR} * hf-bf16 "
                    f"err {scale:.4f} + {PER_SAMPLE_EPS}"
                )
            r.failures += nb.failures(f"layer {k}, sample {sid}")
            if nb.best != k:
                continue
            if moe:  # judged below, against the layer's tolerance (rule 2)
                moe_near += [(sid, o, nb.near[o]) for o in (k - 1, k + 1) if o in nb.near]
        if moe and r.err:
            r.failures += moe_layer_failures(
                k, r.err, r.hf_bf16, [len(s["input_ids"]) for s in samples]
            )
            bound = moe_tolerance(r.hf_bf16)
            r.failures += [
                f"neighbour: layer {k}, sample {sid}: its rows are not far from index "
                f"{other}'s (err {e:.4f} <= {TOL_FACTOR} * max hf-bf16 err "
                f"{max(r.hf_bf16):.4f} + {TOL_EPS}, what rule 2 accepts): an off-by-one could "
                "pass unseen"
                for sid, other, e in moe_near
                if e <= bound
            ]
        out.append(r)
    return out


def compare_finals(
    kinds: Sequence[str], samples: Sequence[Dict], ref: Dict, head: Optional[Head] = None
) -> List[FinalResult]:
    """The captured final states of `samples` against `reference`'s: rule 3 on the states and
    rule 4 on the next-token loss through `head` (default: the reference model's own)."""
    head = head or ref["head"]
    # the head's own check, once per sample: transformers' final state through it gives
    # transformers' loss (else this model makes logits in a way hsdump does not know)
    own = (
        [head.loss(f.post_norm, "post_norm", r["input_ids"]) for f, r in zip(ref["fp32"], samples)]
        if kinds
        else []
    )
    out = []
    for kind in kinds:
        r = FinalResult(kind)
        for p, rec in enumerate(samples):
            f32, f16 = ref["fp32"][p], ref["bf16"][p]
            last = len(f32.hidden_states) - 2  # the input of the last decoder layer
            want = getattr(f32, kind)
            got = rec["final"][kind].float()
            err = rel_err(got, want)
            scale = rel_err(f16.hidden_states[last], f32.hidden_states[last])
            ids = rec["input_ids"]
            loss = head.loss(got, kind, ids)
            r.err.append(err)
            r.hf_bf16.append(scale)
            r.loss.append(loss)
            r.loss_fp32.append(f32.loss)
            r.loss_bf16.append(f16.loss)
            sid = rec.get("id", p)
            if not abs(own[p] - f32.loss) <= 1e-3 * max(1.0, abs(f32.loss)):
                r.failures.append(
                    f"final/{kind}, sample {sid}: the head does not reproduce transformers' own "
                    f"logits (loss {own[p]:.4f} from its final state, {f32.loss:.4f} from its "
                    "logits): this model turns its final state into logits in a way hsdump "
                    "does not know, so the loss check cannot judge it"
                )
            if not final_state_ok(err, scale):
                r.failures.append(
                    f"final/{kind}, sample {sid}: err {err:.4f} > {PER_SAMPLE_FACTOR} * the "
                    f"last layer's hf-bf16 err {scale:.4f} + {FINAL_EPS}"
                )
            if not loss_ok(loss, f32.loss, f16.loss):
                r.failures.append(
                    f"final/{kind}, sample {sid}: next-token loss {loss:.4f} against "
                    f"transformers' {f32.loss:.4f} (its bf16: {f16.loss:.4f}; allowed "
                    f"{LOSS_FACTOR} * {abs(f16.loss - f32.loss):.4f} + {LOSS_EPS})"
                )
        out.append(r)
    return out
