"""The model families whose captured rows are verified against transformers (no sglang import).

SGLang has EAGLE-3 aux capture in many model classes, and they differ where it matters:
which ids they shift, which tensor they record, where the decoder stack sits in a
vision-language wrapper. hsdump sets `layers_to_capture` itself (entry k = the residual stream
entering decoder layer k = transformers `hidden_states[k]`) and finds the decoder stack by
structure (`hsdump.capture.patch.decoder_stack`), but only a comparison with a transformers forward pass of
the same weights proves the rows right. A family is listed here once that comparison passed:
on the CPU in `tests/test_families.py` (CI), or on the GPU by `bench/families_probe.py
--device gpu`, whose results are kept in `bench/results/`. Any other architecture is refused
before the engine starts unless the user sets `capture.allow_unverified=true` (the manifest
then records it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple


@dataclass(frozen=True)
class Family:
    name: str
    architectures: Tuple[str, ...]
    verified: str
    """Where the rows were checked against transformers."""
    tap_input_norm: bool = False
    """SGLang's aux capture records another tensor than the residual stream (Gemma-3): hsdump
    takes the stream from each captured layer's input norm instead (`hsdump.capture.patch.tap_stream`)."""


CPU_TEST = "CPU, tests/test_families.py (SGLang 0.5.23)"
GPU_TEST = "GPU, tests/test_gpu.py (SGLang 0.5.17)"

GPU_PROBE = "GPU, bench/families_probe.py --device gpu (SGLang 0.5.17)"

FAMILIES = (
    Family("Llama", ("LlamaForCausalLM",), CPU_TEST),
    Family("Qwen2", ("Qwen2ForCausalLM",), CPU_TEST),
    Family("Qwen3", ("Qwen3ForCausalLM",), CPU_TEST),
    Family("Qwen3-MoE", ("Qwen3MoeForCausalLM",), CPU_TEST),
    Family("GLM-4.5 MoE", ("Glm4MoeForCausalLM",), CPU_TEST),
    Family("Phi-3", ("Phi3ForCausalLM",), CPU_TEST),
    Family("Mistral", ("MistralForCausalLM",), CPU_TEST),
    Family("MiniMax-M2", ("MiniMaxM2ForCausalLM",), GPU_PROBE),
    Family("GPT-OSS", ("GptOssForCausalLM",), GPU_PROBE + ", MoE rule"),
    Family(
        "Llama-4",
        ("Llama4ForConditionalGeneration",),
        GPU_PROBE + ", +engine.extra.context_length=8192",
    ),
    Family("DeepSeek-V3", ("DeepseekV3ForCausalLM",), GPU_TEST),
    Family(
        "DeepSeek-V3.2", ("DeepseekV32ForCausalLM",), GPU_PROBE + ", with deep_gemm and FlashMLA"
    ),
    Family("Qwen3-Next", ("Qwen3NextForCausalLM",), GPU_PROBE + ", MoE rule"),
    Family(
        "Qwen3.5",
        ("Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration"),
        GPU_PROBE + ", per-layer flags",
    ),
    Family(
        "Qwen3.5-MoE",
        ("Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration"),
        GPU_PROBE + ", per-layer flags",
    ),
    Family(
        "Gemma-3",
        ("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"),
        CPU_TEST + "; " + GPU_PROBE,
        tap_input_norm=True,
    ),
    Family(
        "Kimi-K2.5",
        ("KimiK25ForConditionalGeneration",),
        "GPU, bench/kimi_check.py --both (SGLang 0.5.17; bf16 and INT4 experts)",
    ),
)

LAYER_FLAG_CAPTURE = ("Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM")
"""Classes SGLang 0.5.17 gives no `set_eagle3_layers_to_capture`, though their decoder stack
records the stream entering every layer flagged `_is_layer_to_capture` and the model hands those
rows on to its logits processor: hsdump sets the flags itself (hsdump.capture.patch)."""

_BY_ARCH: Dict[str, Family] = {a: f for f in FAMILIES for a in f.architectures}


def family_of(architecture: str) -> Optional[Family]:
    return _BY_ARCH.get(architecture)


def check_verified(architecture: str, allow_unverified: bool) -> Optional[Family]:
    """The family of `architecture`; ValueError, before any engine starts, if its rows were
    never checked against transformers and the user did not allow that."""
    family = family_of(architecture)
    if family is None and not allow_unverified:
        names = ", ".join(sorted(_BY_ARCH))
        raise ValueError(
            f"{architecture}: hsdump has not verified this model class's captured rows against "
            "transformers, and SGLang's model classes differ in which layer and which tensor "
            "they capture (a wrong layer is written silently). Verified: "
            f"{names}. Check it with `python bench/families_probe.py` on a tiny checkpoint of "
            "the class, or set capture.allow_unverified=true to capture anyway (recorded in "
            "the manifest)"
        )
    return family
