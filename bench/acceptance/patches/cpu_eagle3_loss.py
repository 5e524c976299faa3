"""SpecForge 0.2.0's EAGLE-3 loss is a Triton kernel (specforge/core/loss.py LogSoftmaxLoss),
which has no CPU backend; for the CPU only, the same loss as that file's own reference
implementation (`_compute_loss`: -sum(mask * p_target * log_softmax(logits)) over the vocabulary,
averaged over the rows), eager."""

from __future__ import annotations

_APPLIED = []


def cpu_loss(logits, target_p, position_mask):
    import torch

    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(position_mask * target_p * logp).sum(-1).mean()


def apply() -> None:
    if _APPLIED:
        return
    import specforge.core.loss as L

    L.LogSoftmaxLoss.apply = cpu_loss
    _APPLIED.append(True)
