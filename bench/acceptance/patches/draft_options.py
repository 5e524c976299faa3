"""`draft-config --norm-before-fc` and `--feed-post-norm`: two parts of speculators' EAGLE-3
drafter that SGLang 0.5.17 and 0.5.23 serve (LlamaForCausalLMEagle3: `norm_before_fc`, one
RMSNorm `input_norm` over the concatenated captured layers before fc; `norm_output`, the next
draft step fed the final norm's output rather than its input) and SpecForge 0.2.0's EAGLE-3
drafter lacks. This adds them to SpecForge's drafter when its config asks (`norm_before_fc`;
`feed_post_norm`, since SpecForge reads `norm_output` as "norm before the LM head", its
default), so its trainer, warm start and export all build the drafter SGLang serves. Applied in
every SpecForge process of this package; without those keys the drafter is SpecForge's."""

from __future__ import annotations

_APPLIED = []


def apply() -> None:
    if _APPLIED:
        return
    import specforge.modeling.draft.llama3_eagle as E

    D = E.LlamaForCausalLMEagle3
    draft_init, draft_project = D.__init__, D.project_hidden_states
    draft_backbone, draft_logits = D.backbone, D.compute_logits

    def init_options(self, config, *args, **kwargs):
        draft_init(self, config, *args, **kwargs)
        if getattr(config, "norm_before_fc", False):
            self.input_norm = E.LlamaRMSNorm(self.target_hidden_size * 3, eps=config.rms_norm_eps)

    def project_options(self, hidden_states):
        if getattr(self, "input_norm", None) is not None:
            hidden_states = self.input_norm(hidden_states)
        return draft_project(self, hidden_states)

    def feeds_post_norm(self):
        return bool(getattr(self.config, "feed_post_norm", False))

    def backbone_options(self, *args, **kwargs):
        out = draft_backbone(self, *args, **kwargs)
        return self.norm(out) if feeds_post_norm(self) else out

    def logits_options(self, hidden_states):  # fed post-norm: the state is normed already
        if feeds_post_norm(self):
            return self.lm_head(hidden_states)
        return draft_logits(self, hidden_states)

    D.__init__, D.project_hidden_states = init_options, project_options
    D.backbone, D.compute_logits = backbone_options, logits_options
    _APPLIED.append(True)
