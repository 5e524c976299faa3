"""Drafter kinds (`capture.kinds`): which layers each kind's drafter reads, and which SGLang
serving ids name them (no sglang import).

A kind is a drafter SGLang serves from target hidden states (`--speculative-algorithm`):
EAGLE-3 reads K = 3 layers, DFlash and DSpark K = 5 (SpecForge's `build_target_layer_ids`,
spread from decoder layer 1 to L - 3), and DSpark also the post-norm final state. Layers here
are hsdump's `hf_hidden_states_index` (docs/layers.md); a drafter's config names them by SGLang
serving ids, which each SGLang class maps to its `layers_to_capture` with its own rule
(`hsdump.capture.families.KIND_RULES`). One capture holds the union of the kinds' layers and
final states; `hsdump export --kind K` picks one kind's out of it.

Every kind's layers are kept in ascending order: SGLang's decoder loop appends the aux states
of `layers_to_capture` in layer order, so a served drafter sees them that way whatever order
its config lists them in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

from hsdump.capture.layers import CONVENTION, eagle3_default, resolve_layers
from hsdump.config import DRAFTER_KINDS
from hsdump.errors import Refusal

if TYPE_CHECKING:
    from hsdump.capture.families import IdRule
    from hsdump.config import CaptureConfig


DFLASH_LAYERS = 5
"""K of DFlash and DSpark: SpecForge 0.2.0's configs (Qwen3-8B: serving ids [1, 9, 17, 25, 33])."""


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> List[int]:
    """SpecForge 0.2.0's `specforge.modeling.draft.dflash.build_target_layer_ids`, as written
    there (Python's round: halves to even). Id k names decoder layer k's output, which
    SpecForge's trainer reads as transformers `hidden_states[k + 1]`."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start = 1
    end = num_target_layers - 3
    span = end - start
    return [
        int(round(start + (i * span) / (num_draft_layers - 1))) for i in range(num_draft_layers)
    ]


def dflash_default(num_layers: int) -> List[int]:
    """DFlash's (and DSpark's) default layers in hsdump's convention: SpecForge's ids + 1."""
    return [k + 1 for k in build_target_layer_ids(num_layers, DFLASH_LAYERS)]


@dataclass(frozen=True)
class Kind:
    name: str
    algorithm: str
    """SGLang's `--speculative-algorithm` for this drafter."""
    finals: Tuple[str, ...]
    """Final states every trainer of this kind reads (a capture of the kind always holds them;
    the final state of one trainer only, e.g. speculators' pre-norm one for EAGLE-3, is asked
    for by `hsdump export`, which names capture.final when it is missing)."""

    def default_layers(self, num_layers: int) -> List[int]:
        if self.name == "eagle3":
            return eagle3_default(num_layers)
        return dflash_default(num_layers)


KINDS: Dict[str, Kind] = {
    name: Kind(name, name.upper(), finals) for name, finals in DRAFTER_KINDS.items()
}
"""The kinds a capture serves (`capture.kinds`); names are SGLang's algorithms, lower case."""

EXPORT_KINDS: Dict[str, Tuple[str, ...]] = {
    "specforge": ("eagle3", "dflash", "dspark", "domino"),
    "speculators": ("eagle3", "dflash"),
}
"""What `hsdump export --to T --kind K` writes. Domino is trained by SpecForge on DFlash's
records (`dflash_family_data.normalize_offline_sample`) and takes DFlash's layers; speculators'
DSpark checkpoints are refused by SGLang (sglang #30261), so it is not offered."""

LAYERS_OF = {"domino": "dflash"}
"""An export kind whose layers are another capture kind's."""


def _check(source: str, layers: Sequence[int], num_layers: int) -> List[int]:
    out = [int(x) for x in layers]
    if len(set(out)) != len(out):
        raise Refusal(
            f"{source}={out} repeats a layer (a {num_layers}-layer model is too shallow for "
            f"its spread); list each index once, e.g. {source}={sorted(set(out))}"
        )
    bad = [k for k in out if not 1 <= k <= num_layers - 1]
    if bad:
        raise Refusal(
            f"{source}={out}: {bad} out of range for a model with {num_layers} decoder layers "
            f"({CONVENTION}: 1..{num_layers - 1})"
        )
    return sorted(out)


def kind_layers(
    capture: "CaptureConfig", default_layers: Optional[Sequence[int]], num_layers: int
) -> Dict[str, List[int]]:
    """Each kind's layers (ascending, hf_hidden_states_index): `capture.kind_layers.<kind>`,
    else for a single kind `capture.layers` or the preset's `default_layers` (EAGLE-3's in
    every preset), else the kind's default for the model's depth."""
    out: Dict[str, List[int]] = {}
    single = len(capture.kinds) == 1
    for name in capture.kinds:
        given = (capture.kind_layers or {}).get(name)
        if given is not None:
            out[name] = _check(f"capture.kind_layers.{name}", given, num_layers)
        elif single and capture.layers is not None:
            out[name] = sorted(resolve_layers(capture.layers, None, num_layers))
        elif name == "eagle3" and default_layers is not None:
            out[name] = sorted(resolve_layers(None, default_layers, num_layers))
        else:
            out[name] = _check(
                f"{name}'s default (capture.kind_layers.{name})",
                KINDS[name].default_layers(num_layers),
                num_layers,
            )
    return out


def capture_layers(
    capture: "CaptureConfig", default_layers: Optional[Sequence[int]], num_layers: int
) -> Tuple[List[int], Dict[str, List[int]]]:
    """(the layers to capture, each kind's layers). Explicit `capture.layers` win and are
    captured as given, but must hold every kind's layers; otherwise the union of the kinds'
    layers is captured (the first kind's, then each further kind's new ones)."""
    if capture.layers is not None:  # its own refusals first (empty, repeated, out of range)
        resolve_layers(capture.layers, None, num_layers)
    per_kind = kind_layers(capture, default_layers, num_layers)
    union: List[int] = []
    for name in capture.kinds:
        union += [k for k in per_kind[name] if k not in union]
    if capture.layers is None:
        return union, per_kind
    layers = resolve_layers(capture.layers, None, num_layers)
    for name, want in per_kind.items():
        missing = [k for k in want if k not in layers]
        if missing:
            fix = sorted(set(union) | set(layers))
            raise Refusal(
                f"capture.layers={layers} lacks {missing} of {name}'s layers {want} "
                f"(capture.kinds={list(capture.kinds)}): capture.layers={fix} captures every "
                f"kind's, or set capture.kind_layers.{name} to layers it holds, or drop "
                "capture.layers to capture the union of the kinds' layers"
            )
    return layers, per_kind


def serving_ids(rule: Optional["IdRule"], layers: Sequence[int]) -> Optional[List[int]]:
    """The ids a drafter's config must carry so that SGLang's class (its setter's `rule`)
    captures `layers` (hf_hidden_states_index, ascending); None where no ids can, or the
    rule is unknown."""
    if rule is None:
        return None
    hf = [int(k) for k in layers]
    if rule.shift == "plus1":
        return [k - 1 for k in hf]
    if rule.shift == "none":
        return hf
    if rule.shift == "first_id_1":  # shifts every id by 1 only when the first id is 1
        if hf and hf[0] == 2:
            return [k - 1 for k in hf]
        return None if hf and hf[0] == 1 else hf
    raise Refusal(f"unknown id rule {rule.shift!r}")


def layers_of(ids: Sequence[int], rule: "IdRule") -> List[int]:
    """The hf_hidden_states_index layers SGLang's class captures for serving `ids`."""
    ids = [int(i) for i in ids]
    if rule.shift == "plus1" or (rule.shift == "first_id_1" and ids and ids[0] == 1):
        return [i + 1 for i in ids]
    return ids


def record(
    per_kind: Dict[str, List[int]],
    architecture: str,
    sglang_version: Optional[str],
) -> Dict[str, dict]:
    """manifest.json's `kinds`: per kind, SGLang's algorithm, its layers, the serving ids that
    name them for this class on this SGLang version (null where hsdump has no checked rule:
    a class captured with capture.allow_unverified=true, engine=dry), the SGLang method that
    takes those ids and where its rule was checked, and the final states it needs."""
    from hsdump.capture.families import kind_rule

    out = {}
    for name, layers in per_kind.items():
        rule = kind_rule(architecture, name, sglang_version)
        ids = serving_ids(rule, layers)
        out[name] = {
            "algorithm": KINDS[name].algorithm,
            "layers": list(layers),
            "serving_ids": ids,
            "sglang_version": sglang_version,
            "setter": rule.setter if rule and ids is not None else None,
            "checked": rule.where if rule and ids is not None else None,
            "finals": list(KINDS[name].finals),
        }
    return out


def manifest_kinds(
    capture: "CaptureConfig",
    default_layers: Optional[Sequence[int]],
    architecture: str,
    num_layers: int,
    sglang_version: Optional[str],
) -> Dict[str, dict]:
    """manifest.json's `kinds` for a run (`record` of the run's kinds and their layers)."""
    return record(kind_layers(capture, default_layers, num_layers), architecture, sglang_version)
