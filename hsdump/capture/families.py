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

A check holds for the SGLang release it ran on: each family lists its (version, where) runs,
and on an SGLang version none of them ran on the class is refused the same way, with the
versions that were verified (the installed version is read from the distribution's metadata,
without importing SGLang).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from importlib import metadata
from typing import Dict, Optional, Tuple

from hsdump.errors import Refusal

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Family:
    name: str
    architectures: Tuple[str, ...]
    runs: Tuple[Tuple[str, str], ...]
    """(SGLang version, where the rows were checked against transformers on it), one per
    version: the gate accepts the family on these versions only."""
    tap_input_norm: bool = False
    """SGLang's aux capture records another tensor than the residual stream (Gemma-3): hsdump
    takes the stream from each captured layer's input norm instead (`hsdump.capture.patch.tap_stream`)."""

    @property
    def versions(self) -> Tuple[str, ...]:
        return tuple(v for v, _ in self.runs)

    def verified_on(self, sglang_version: Optional[str]) -> Optional[str]:
        """Where the rows were checked on this SGLang version (its release part: 0.5.23.post1 is
        0.5.23), None if they never were."""
        rel = release(sglang_version)
        return next((w for v, w in self.runs if v == rel), None)

    @property
    def verified(self) -> str:
        """Every check, one per version: `<where> (SGLang <version>)`, joined by `; `."""
        return "; ".join(f"{w} (SGLang {v})" for v, w in self.runs)


def release(version: Optional[str]) -> Optional[str]:
    """The release part of a version string (`0.5.23.post1`, `0.5.23rc0` -> `0.5.23`)."""
    if not version:
        return None
    m = re.match(r"\d+(?:\.\d+)*", version.strip())
    return ".".join(m.group(0).split(".")[:3]) if m else version.strip()


def installed_sglang() -> Optional[str]:
    """The installed SGLang's version from its distribution metadata (SGLang is not imported);
    None when it is not installed."""
    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return None


CPU_TEST = "CPU, tests/test_families.py"
CPU_PROBE = (
    "CPU, bench/families_probe.py (bench/results/families-cpu.json); SGLang's class is "
    "LlamaForCausalLM's code, which tests/test_families.py checks"
)
GPU_TEST = "GPU, tests/test_gpu.py"
GPU_PROBE = "GPU, bench/families_probe.py --device gpu"
V23, V17 = "0.5.23", "0.5.17"
QWEN2_GPU17 = (
    "GPU, `hsdump check` of model=qwen2_5_coder_1_5b's capture in the speed-up run "
    "(bench/results/speedup-qwen-coder-1.5b-0517/)"
)


def _cpu(*extra: Tuple[str, str]) -> Tuple[Tuple[str, str], ...]:
    return ((V23, CPU_TEST),) + extra


def _gpu(note: str = "", *versions: str) -> Tuple[Tuple[str, str], ...]:
    """GPU probe runs on SGLang 0.5.17 and on each of `versions` (0.5.23's:
    bench/results/families-gpu-0523.json)."""
    where = GPU_PROBE + (", " + note if note else "")
    return tuple((v, where) for v in (V17, *versions))


def _gpu23(note: str = "") -> Tuple[Tuple[str, str], ...]:
    """Probed on the GPU on SGLang 0.5.23 only (its CPU engine cannot run the class)."""
    return ((V23, GPU_PROBE + (", " + note if note else "")),)


FAMILIES = (
    Family(
        "Llama",
        ("LlamaForCausalLM",),
        ((V23, CPU_TEST + "; " + GPU_TEST), (V17, GPU_TEST)),
    ),
    Family(
        "Qwen2",
        ("Qwen2ForCausalLM",),
        ((V23, "CPU, tests/test_qwen_coder.py (Qwen2.5-Coder-1.5B-Instruct)"), (V17, QWEN2_GPU17)),
    ),
    Family("Qwen3", ("Qwen3ForCausalLM",), _cpu()),
    Family("Qwen3-MoE", ("Qwen3MoeForCausalLM",), _cpu()),
    Family("GLM-4.5 MoE", ("Glm4MoeForCausalLM",), _cpu()),
    # SGLang 0.5.23's Phi3ForCausalLM and MistralForCausalLM subclass LlamaForCausalLM and add
    # nothing: their CPU test runs left CI for its 20 minutes; the probe's run stands
    Family("Phi-3", ("Phi3ForCausalLM",), ((V23, CPU_PROBE),)),
    Family("Mistral", ("MistralForCausalLM",), ((V23, CPU_PROBE),)),
    Family("MiniMax-M2", ("MiniMaxM2ForCausalLM",), _gpu("", V23)),
    Family("GPT-OSS", ("GptOssForCausalLM",), _gpu("MoE rule", V23)),
    Family(
        "Llama-4",
        ("Llama4ForConditionalGeneration",),
        _gpu("+engine.extra.context_length=8192", V23),
    ),
    Family("DeepSeek-V3", ("DeepseekV3ForCausalLM",), ((V17, GPU_TEST), (V23, GPU_TEST))),
    Family(
        "DeepSeek-V3.2",
        ("DeepseekV32ForCausalLM",),
        ((V17, GPU_PROBE + ", with deep_gemm and FlashMLA"), (V23, GPU_PROBE + ", with deep_gemm")),
    ),
    Family("Qwen3-Next", ("Qwen3NextForCausalLM",), _gpu("MoE rule", V23)),
    Family(
        "Qwen3.5",
        ("Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration"),
        _gpu("per-layer flags", V23),
    ),
    Family(
        "Qwen3.5-MoE",
        ("Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration"),
        _gpu("per-layer flags", V23),
    ),
    Family("DeepSeek-V2", ("DeepseekV2ForCausalLM",), _gpu23()),
    Family("GLM-4-MoE-Lite", ("Glm4MoeLiteForCausalLM",), _gpu23()),
    Family("Qwen2-MoE", ("Qwen2MoeForCausalLM",), _gpu23()),
    Family(
        "Gemma-3",
        ("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"),
        _cpu((V17, GPU_PROBE)),
        tap_input_norm=True,
    ),
    Family("Qwen3-VL", ("Qwen3VLForConditionalGeneration",), _cpu()),
    Family("Qwen3-VL-MoE", ("Qwen3VLMoeForConditionalGeneration",), _cpu()),
    Family("Qwen2.5-VL", ("Qwen2_5_VLForConditionalGeneration",), _cpu()),
    Family("Ministral-3", ("Ministral3ForCausalLM",), _cpu()),
    Family("Apertus", ("ApertusForCausalLM",), _cpu()),
    Family("Mellum", ("MellumForCausalLM",), _cpu()),
    Family(
        "Gemma-4",
        ("Gemma4ForConditionalGeneration",),
        ((V23, CPU_TEST + ", +engine.attention_backend=intel_amx"),),
    ),
    Family(
        "Kimi-K2.5",
        ("KimiK25ForConditionalGeneration",),
        (
            (
                V23,
                "GPU, tests/test_gpu_kimi.py (bf16 and INT4 experts, separate runs and "
                "through pytest)",
            ),
            (V17, "GPU, tests/test_gpu_kimi.py's check (bf16 and INT4 experts)"),
        ),
    ),
)

LAYER_FLAG_CAPTURE = ("Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM")
"""Classes SGLang 0.5.17 gives no `set_eagle3_layers_to_capture`, though their decoder stack
records the stream entering every layer flagged `_is_layer_to_capture` and the model hands those
rows on to its logits processor: hsdump sets the flags itself (hsdump.capture.patch)."""

_BY_ARCH: Dict[str, Family] = {a: f for f in FAMILIES for a in f.architectures}


def family_of(architecture: str) -> Optional[Family]:
    return _BY_ARCH.get(architecture)


_INSTALLED = "installed"


def check_verified(
    architecture: str, allow_unverified: bool, sglang_version: Optional[str] = _INSTALLED
) -> Optional[Family]:
    """The family of `architecture` if its rows were checked against transformers on this
    SGLang version (default: the installed one; None: no SGLang runs, e.g. engine=dry, and only
    the class is checked). ValueError, before any engine starts, if they never were and the
    user did not allow that; with capture.allow_unverified=true, None for a class or version
    never checked (the manifest then records no family)."""
    if sglang_version == _INSTALLED:
        sglang_version = installed_sglang()
    family = family_of(architecture)
    allow = "set capture.allow_unverified=true to capture anyway (recorded in the manifest)"
    if family is None:
        if allow_unverified:
            return None
        names = ", ".join(sorted(_BY_ARCH))
        raise Refusal(
            f"{architecture}: hsdump has not verified this model class's captured rows against "
            "transformers, and SGLang's model classes differ in which layer and which tensor "
            "they capture (a wrong layer is written silently). Verified: "
            f"{names}. Check it with `python bench/families_probe.py` on a tiny checkpoint of "
            f"the class, or {allow}"
        )
    if sglang_version is None or family.verified_on(sglang_version) is not None:
        return family
    if allow_unverified:
        return None
    raise Refusal(
        f"{architecture} ({family.name}): hsdump verified this class's captured rows against "
        f"transformers on SGLang {', '.join(family.versions)} only, not on the installed "
        f"SGLang {sglang_version} (model classes change between releases: which layers they "
        "capture, which tensor). Install a verified version, check this one with "
        f"`python bench/families_probe.py` on a tiny checkpoint of the class, or {allow}"
    )


# ------------------------------------------------------------------ drafter kinds' layer ids
@dataclass(frozen=True)
class IdRule:
    """How one SGLang class turns a drafter's layer ids into its `layers_to_capture` (entry k =
    transformers `hidden_states[k]`) for one drafter kind."""

    setter: str
    """The SGLang method that takes the ids (its owner class, as resolved for the checkpoint's
    architecture)."""
    shift: str
    """`plus1`: id k captures hidden_states[k + 1] (the output of decoder layer k). `none`: id
    k captures hidden_states[k]. `first_id_1`: +1 only when the first id is 1 (DeepSeek-V2's
    EAGLE-3 setter, sglang #25454)."""
    where: str
    """Where the rule was checked: a CPU engine run against transformers, or a code reading."""


KIND_CPU_TEST = "CPU, tests/test_kinds.py (SGLang's own capture against transformers)"
READ = "code reading of SGLang 0.5.23 (tests/test_kinds.py checks the owner class)"
READ17 = "code reading of SGLang 0.5.17 (tests/test_kinds.py reads its wheel's model sources)"
_DSPARK_ROUTE = (
    "; DSPARK: the class has no set_dspark_layers_to_capture, and SGLang's "
    "configure_aux_hidden_state_capture then calls its set_dflash_layers_to_capture"
)


def _dflash_family(
    setter_owner: str, where_dflash: str, where_dspark: str, shift: str = "plus1"
) -> Dict[str, IdRule]:
    setter = f"{setter_owner}.set_dflash_layers_to_capture"
    return {
        "dflash": IdRule(setter, shift, where_dflash),
        "dspark": IdRule(setter, shift, where_dspark + _DSPARK_ROUTE),
    }


def _eagle3(owner: str, shift: str = "plus1", where: str = READ) -> Dict[str, IdRule]:
    return {"eagle3": IdRule(f"{owner}.set_eagle3_layers_to_capture", shift, where)}


def _read(owner: str, eagle3_shift: str = "plus1", where: str = READ) -> Dict[str, IdRule]:
    """Rules read from SGLang's code (tests/test_kinds.py checks each setter's owner class)."""
    return {**_eagle3(owner, eagle3_shift, where), **_dflash_family(owner, where, where)}


KIND_RULES: Dict[str, Dict[str, Dict[str, IdRule]]] = {
    V23: {
        # checked on the CPU engine: one kind per class, the other by the code reading
        "LlamaForCausalLM": {
            **_eagle3("LlamaForCausalLM"),
            **_dflash_family("LlamaForCausalLM", KIND_CPU_TEST, READ),
        },
        "Qwen3ForCausalLM": {
            **_eagle3("Qwen3ForCausalLM"),
            **_dflash_family("Qwen3ForCausalLM", READ, KIND_CPU_TEST),
        },
        "Phi3ForCausalLM": _read("LlamaForCausalLM"),
        "MistralForCausalLM": _read("LlamaForCausalLM"),
        "Ministral3ForCausalLM": _read("LlamaForCausalLM"),
        "Qwen3MoeForCausalLM": _read("Qwen3MoeForCausalLM"),
        "MellumForCausalLM": _read("Qwen3MoeForCausalLM"),
        "Qwen3NextForCausalLM": _read("Qwen3NextForCausalLM"),
        "Qwen3VLForConditionalGeneration": _read("Qwen3VLForConditionalGeneration"),
        "Qwen3VLMoeForConditionalGeneration": _read("Qwen3VLForConditionalGeneration"),
        "Qwen3_5ForConditionalGeneration": _read("Qwen3VLForConditionalGeneration"),
        "Qwen3_5MoeForConditionalGeneration": _read("Qwen3VLForConditionalGeneration"),
        # the text classes SGLang registers are qwen3_5_text.py's (qwen3_5.py's class of the
        # same name is the VL wrappers' stack, which takes its own indices unshifted)
        "Qwen3_5ForCausalLM": _read("Qwen3_5ForCausalLM"),
        "Qwen3_5MoeForCausalLM": _read("Qwen3_5ForCausalLM"),
        "GptOssForCausalLM": _read("GptOssForCausalLM"),
        "Gemma4ForConditionalGeneration": _read("Gemma4ForConditionalGeneration"),
        # DeepSeek-V2's EAGLE-3 setter shifts only when the first id is 1; its DFlash setter always
        "DeepseekV2ForCausalLM": _read("DeepseekV2ForCausalLM", eagle3_shift="first_id_1"),
        "DeepseekV3ForCausalLM": _read("DeepseekV2ForCausalLM", eagle3_shift="first_id_1"),
        "DeepseekV32ForCausalLM": _read("DeepseekV2ForCausalLM", eagle3_shift="first_id_1"),
        "Glm4MoeLiteForCausalLM": _read("Glm4MoeLiteForCausalLM", eagle3_shift="first_id_1"),
        # delegates to its DeepseekV3ForCausalLM language model
        "KimiK25ForConditionalGeneration": _read(
            "KimiK25ForConditionalGeneration", eagle3_shift="first_id_1"
        ),
        # EAGLE-3 only (no DFlash setter in 0.5.23: SGLang refuses DFLASH/DSPARK on them)
        "Qwen2ForCausalLM": _eagle3("Qwen2ForCausalLM"),
        "Qwen2MoeForCausalLM": _eagle3("Qwen2MoeForCausalLM"),
        "Glm4MoeForCausalLM": _eagle3("Glm4MoeForCausalLM"),
        "MiniMaxM2ForCausalLM": _eagle3("MiniMaxM2ForCausalLM"),
        "Qwen2_5_VLForConditionalGeneration": _eagle3("Qwen2_5_VLForConditionalGeneration"),
        "ApertusForCausalLM": _eagle3("ApertusForCausalLM"),
        "Gemma3ForCausalLM": _eagle3("Gemma3ForCausalLM"),
    },
}
# SGLang 0.5.17 (the GPU host image's torch 2.11 takes it): the classes verified on 0.5.17
# (FAMILIES), each with the setters 0.5.17's own model code gives it. Its
# configure_aux_hidden_state_capture (model_runner_components/attention_backend_setup.py) sends
# DSPARK to set_dflash_layers_to_capture when the class has no DSpark hook, as 0.5.23 does.
# Qwen3_5ForCausalLM / Qwen3_5MoeForCausalLM have no setter at all on 0.5.17 (LAYER_FLAG_CAPTURE):
# SGLang 0.5.17 serves no drafter kind on them.
KIND_RULES[V17] = {
    "LlamaForCausalLM": _read("LlamaForCausalLM", where=READ17),
    "GptOssForCausalLM": _read("GptOssForCausalLM", where=READ17),
    "Qwen3NextForCausalLM": _read("Qwen3NextForCausalLM", where=READ17),
    "Qwen3_5ForConditionalGeneration": _read("Qwen3VLForConditionalGeneration", where=READ17),
    "Qwen3_5MoeForConditionalGeneration": _read("Qwen3VLForConditionalGeneration", where=READ17),
    "DeepseekV3ForCausalLM": _read(
        "DeepseekV2ForCausalLM", eagle3_shift="first_id_1", where=READ17
    ),
    "DeepseekV32ForCausalLM": _read(
        "DeepseekV2ForCausalLM", eagle3_shift="first_id_1", where=READ17
    ),
    # delegates to its DeepseekV3ForCausalLM language model
    "KimiK25ForConditionalGeneration": _read(
        "KimiK25ForConditionalGeneration", eagle3_shift="first_id_1", where=READ17
    ),
    # EAGLE-3 only (no DFlash setter in 0.5.17: SGLang refuses DFLASH/DSPARK on them)
    "MiniMaxM2ForCausalLM": _eagle3("MiniMaxM2ForCausalLM", where=READ17),
    "Gemma3ForCausalLM": _eagle3("Gemma3ForCausalLM", where=READ17),
    "Qwen2ForCausalLM": _eagle3("Qwen2ForCausalLM", where=READ17),
}
"""Per SGLang release, per architecture, per drafter kind: the rule of the setter SGLang calls
for that kind. DFlash/DSpark rules exist for the verified classes whose class on that release
has a DFlash setter; others are refused for those kinds (`check_kinds`). EAGLE-3's rules only
give the serving ids the manifest records (hsdump captures its own indices for every kind)."""


def kind_rule(architecture: str, kind: str, sglang_version: Optional[str]) -> Optional[IdRule]:
    """The rule of `architecture`'s setter for `kind` on this SGLang release (None: unknown;
    sglang_version None, as for engine=dry: the newest release's)."""
    rel = release(sglang_version) if sglang_version else max(KIND_RULES)
    return KIND_RULES.get(rel, {}).get(architecture, {}).get(kind)


CHECKED, NO_SETTER, UNCHECKED = "checked", "no setter", "not checked"
KIND_NAMES = {"eagle3": "EAGLE-3", "dflash": "DFlash", "dspark": "DSpark"}


def _rel(sglang_version: Optional[str]) -> str:
    """The release whose rules apply (sglang_version None, as for engine=dry: the newest)."""
    return release(sglang_version) if sglang_version else max(KIND_RULES)


def kind_support(architecture: str, kind: str, sglang_version: Optional[str]) -> str:
    """What hsdump knows of serving a `kind` drafter of `architecture` on this SGLang release:
    CHECKED (a rule in KIND_RULES: the manifest records its serving ids); NO_SETTER (the
    release's class has no setter for the kind, so SGLang cannot serve it on this class at all:
    a class in KIND_RULES without the kind, or one of LAYER_FLAG_CAPTURE on 0.5.17, which has
    no setter of any kind); UNCHECKED (hsdump never read or ran the class's setter)."""
    rel = _rel(sglang_version)
    rules = KIND_RULES.get(rel, {})
    if kind in rules.get(architecture, {}):
        return CHECKED
    if architecture in rules or (rel == V17 and architecture in LAYER_FLAG_CAPTURE):
        return NO_SETTER
    return UNCHECKED


def kind_advice(architecture: str, kind: str, sglang_version: Optional[str]) -> str:
    """Why a `kind` drafter of `architecture` has no serving ids on this SGLang release, and
    what to do instead: the one text of extract's refusal (`check_kinds`), `hsdump export`'s
    advice and its closing line. "" where the kind is CHECKED."""
    support = kind_support(architecture, kind, sglang_version)
    if support == CHECKED:
        return ""
    rel = _rel(sglang_version)
    name = KIND_NAMES.get(kind, kind)
    known = sorted(a for a, r in KIND_RULES.get(rel, {}).items() if kind in r)
    checked = f"Checked for {kind}: {', '.join(known) or 'none'} (SGLang {rel})."
    if support == NO_SETTER:
        return (
            f"SGLang {rel} cannot serve a {name} drafter of {architecture}: its model class has "
            f"no {kind} layer setter, so SGLang refuses --speculative-algorithm "
            f"{kind.upper()} on it. {checked} Train an EAGLE-3 drafter instead "
            "(capture.kinds=[eagle3], the default; `hsdump export --kind eagle3`), or serve "
            f"{name} from a class that has it; capture.allow_unverified=true captures the "
            f"{kind} layers anyway, for a server other than SGLang {rel}"
        )
    return (
        f"hsdump has not checked which layers SGLang {rel} serves a {name} drafter of "
        f"{architecture} from (each class's setter maps a drafter's layer ids its own way; a "
        f"wrong one serves the drafter one layer off, silently). {checked} Train an EAGLE-3 "
        "drafter (capture.kinds=[eagle3], the default), or set capture.allow_unverified=true "
        f"to capture {kind} anyway (the manifest then records no serving ids for it: read "
        'them from SGLang\'s class before serving, docs/layers.md, "Drafter kinds")'
    )


def check_kinds(
    architecture: str, kinds, allow_unverified: bool, sglang_version: Optional[str] = _INSTALLED
) -> None:
    """ValueError, before any engine starts, for a DFlash or DSpark capture of a class whose
    ids rule for that kind hsdump never checked on this SGLang release (its drafter would be
    served one layer off, silently), or whose class on that release cannot serve the kind at
    all, unless capture.allow_unverified=true (`kind_advice` says which, and what instead)."""
    if sglang_version == _INSTALLED:
        sglang_version = installed_sglang()
    for kind in kinds:
        if kind == "eagle3" or kind_support(architecture, kind, sglang_version) == CHECKED:
            continue
        if allow_unverified:  # captured, and said: its serving ids stay null
            log.warning(
                "capture.allow_unverified=true: capturing %s anyway; %s",
                kind,
                kind_advice(architecture, kind, sglang_version),
            )
            continue
        raise Refusal(
            f"capture.kinds holds {kind} (capture=all_kinds holds dflash and dspark): "
            + kind_advice(architecture, kind, sglang_version)
        )


KINDS_TABLE = ("<!-- kinds table: begin -->", "<!-- kinds table: end -->")
"""The markers around docs/layers.md's table of classes by kind (`kinds_table`)."""

_SHIFT = {"plus1": "id + 1", "none": "id", "first_id_1": "id + 1 if the first is 1"}


def _cell(architecture: str, kind: str, rel: str) -> str:
    family = family_of(architecture)
    if family is None or family.verified_on(rel) is None:
        return "class not verified"
    support = kind_support(architecture, kind, rel)
    if support == CHECKED:
        return _SHIFT[KIND_RULES[rel][architecture][kind].shift]
    return "**no setter**" if support == NO_SETTER else "not checked"


def kinds_table() -> str:
    """docs/layers.md's table: per verified class and SGLang release, whether SGLang serves
    each drafter kind from hsdump's capture and how the serving ids name the layers, from
    FAMILIES and KIND_RULES (tests/test_kind_support.py keeps the doc equal to it)."""
    rels = sorted(KIND_RULES, key=lambda v: tuple(int(x) for x in v.split(".")), reverse=True)
    kinds = list(KIND_NAMES)
    head = ["class"] + [f"{KIND_NAMES[k]}, {r}" for r in rels for k in kinds]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for fam in FAMILIES:
        for arch in fam.architectures:
            cells = [_cell(arch, k, r) for r in rels for k in kinds]
            lines.append(f"| {arch} ({fam.name}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)
