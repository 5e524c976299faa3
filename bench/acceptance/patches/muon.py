"""`train --optimizer muon`: speculators' optimizer in SpecForge 0.2.0's BF16Optimizer, which
builds AdamW (no weight decay) over fp32 master copies of the trainable parameters and has no
key to change it. Here its masters are split as speculators splits them: Muon (momentum 0.95,
weight decay 0.1, its RMS matched to AdamW's) on every 2-D matrix but an embedding, a head, a
codebook or DSpark's Markov factors, and AdamW (weight decay 0.01) on the rest, in one optimizer
that SpecForge's scheduler, clip, state_dict and checkpoints drive as its AdamW."""

from __future__ import annotations

import inspect

import torch

NOT_MUON = ("embed_tokens", "lm_head", "codebook", "markov_w1", "markov_w2")
_APPLIED = []


def is_matrix(n, p):
    return p.ndim == 2 and min(p.shape) > 1 and not any(h in n for h in NOT_MUON)


class MuonAdamW(torch.optim.Optimizer):
    def __init__(self, named, lr):
        muon = [p for n, p in named if is_matrix(n, p)]
        rest = [p for n, p in named if not is_matrix(n, p)]
        self._inner = []
        if muon:
            self._inner.append(
                torch.optim.Muon(
                    muon, lr=lr, weight_decay=0.1, momentum=0.95, adjust_lr_fn="match_rms_adamw"
                )
            )
        if rest:
            self._inner.append(torch.optim.AdamW(rest, lr=lr, weight_decay=0.01))
        super().__init__([g for o in self._inner for g in o.param_groups], {"lr": lr})
        self._link()
        print(f"hsdump: Muon on {len(muon)} matrices, AdamW on {len(rest)} tensors", flush=True)

    def _link(self):  # the inner optimizers step the groups and the state this one holds
        i = 0
        for o in self._inner:
            o.param_groups = self.param_groups[i : i + len(o.param_groups)]
            o.state = self.state
            i += len(o.param_groups)

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        self._link()

    @torch.no_grad()
    def step(self, closure=None):
        for o in self._inner:
            o.step()


def apply() -> None:
    if _APPLIED:
        return
    import specforge.optimizer as O

    init = O.BF16Optimizer.__init__

    def init_muon(self, model, lr, *args, **kwargs):
        init(self, model, lr, *args, **kwargs)
        a = inspect.signature(init).bind(self, model, lr, *args, **kwargs)
        a.apply_defaults()
        a = a.arguments
        names = [n for n, p in model.named_parameters() if p.requires_grad]  # as its masters
        self.optimizer = MuonAdamW(list(zip(names, self.fp32_params)), lr)
        self.scheduler = type(self.scheduler)(
            self.optimizer,
            total_steps=a["total_steps"],
            warmup_steps=int(a["warmup_ratio"] * a["total_steps"]),
        )

    O.BF16Optimizer.__init__ = init_muon
    _APPLIED.append(True)
