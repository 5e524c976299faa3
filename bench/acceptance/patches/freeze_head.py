"""`train --head-init target-frozen`: SpecForge 0.2.0's EAGLE-3 builder freezes the drafter's
embedding (`freeze_embedding`, which its optimizer then leaves out: it takes the parameters that
require grad); the drafter's LM head, started at the target's rows, is frozen beside it, as
speculators' trainer keeps its own. Checkpoints and the export carry the head as before."""

from __future__ import annotations

_APPLIED = []


def apply() -> None:
    if _APPLIED:
        return
    import specforge.modeling.draft.base as B

    freeze_embedding = B.Eagle3DraftModel.freeze_embedding

    def freeze_embedding_and_head(self):
        freeze_embedding(self)
        self.lm_head.weight.requires_grad = False
        print("hsdump: the drafter's LM head is frozen at the target's rows", flush=True)

    B.Eagle3DraftModel.freeze_embedding = freeze_embedding_and_head
    _APPLIED.append(True)
