"""reference_capture.py's comparison: hsdump's tensors (a dataset or its SpecForge export) and
SpecForge's records loaded side by side per export position, the metrics per sample and tensor
(relative error, shifted rows, the closest captured tensor, against transformers), their
summary, and the Markdown table."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Dict, List, Optional

GROUP = 2000
SHIFT_NOTE = 0.1  # a tensor this far off gets its shifted and neighbouring errors reported


# ----------------------------------------------------------------------------- manifest
def manifest_facts(dataset: str) -> dict:
    """Model folder, EAGLE-3 layers and their SGLang ids, as the dataset's manifest records."""
    from hsdump.store.commits import read_manifest

    m = read_manifest(Path(dataset))
    model = m.get("model") or {}
    kinds = m.get("kinds") or {}
    e3 = kinds.get("eagle3") or {}
    return {
        "model": model.get("resolved_path") or model.get("path"),
        "architecture": model.get("architecture"),
        "num_hidden_layers": model.get("num_hidden_layers"),
        "dtype": model.get("dtype"),
        "layers": list(m.get("layers") or []),
        "eagle3_layers": [int(k) for k in (e3.get("layers") or m.get("layers") or [])],
        "eagle3_serving_ids": e3.get("serving_ids"),
        "final": m.get("final") or [],
        "versions": m.get("versions") or {},
        "sglang_version": m.get("sglang_version"),
    }


# ----------------------------------------------------------------------------- loading
class HsdumpSide:
    """hsdump's tensors per export position: the EAGLE-3 layers and the final state a
    SpecForge record carries, plus every other captured layer and final state when the
    dataset is at hand."""

    def __init__(self, path: str, dataset: Optional[str] = None):
        p = Path(path)
        self.export = None
        self.ds = None
        if (p / "manifest.json").exists():
            dataset = str(p)
        elif (p / "hsdump_export.json").exists():
            self.export = json.loads((p / "hsdump_export.json").read_text())
            if self.export.get("to") != "specforge":
                raise SystemExit(f"{p}: an export --to specforge (--kind eagle3|dflash|dspark)")
            src = self.export.get("source")
            if dataset is None and src and (Path(src) / "manifest.json").exists():
                dataset = src
        else:
            raise SystemExit(f"{p}: neither an hsdump dataset nor an hsdump export")
        self.path = p
        if dataset is not None:
            from hsdump.store.reader import HsdumpDataset

            self.ds = HsdumpDataset(dataset)
            self.facts = manifest_facts(dataset)
        else:
            self.facts = None
        if self.export is not None:
            self.ids = [int(i) for i in self.export["ids"]]
            self.e3_layers = [int(k) for k in self.export["kind_layers"]]
            self.serving_ids = self.export.get("serving_ids")
            self.final_kind = self.export.get("final_state")
        else:
            self.ids = list(self.ds.ids)
            self.e3_layers = self.facts["eagle3_layers"]
            self.serving_ids = self.facts["eagle3_serving_ids"]
            self.final_kind = "post_norm" if "post_norm" in self.facts["final"] else None
        self.all_layers = list(self.ds.layers) if self.ds is not None else list(self.e3_layers)
        self.dataset = str(self.ds.path) if self.ds is not None else None

    def get(self, pos: int) -> dict:
        """`input_ids`, `loss_mask`, `aux` (list, EAGLE-3 order), `final` (the SpecForge
        slot), `others` {name: tensor} of every captured tensor (for the closest-match
        search)."""

        sid = self.ids[pos]
        out: Dict[str, object] = {"id": sid, "others": {}}
        if self.export is not None:
            rec = load_ckpt(self.path, pos)
            out["input_ids"] = rec["input_ids"].reshape(-1)
            out["loss_mask"] = rec["loss_mask"].reshape(-1)
            out["aux"], out["final"] = split_record(rec, len(self.e3_layers))
        if self.ds is not None:
            rec = self.ds.get(sid)
            if self.export is None:
                out["input_ids"] = rec["input_ids"]
                out["loss_mask"] = rec["loss_mask"]
                out["aux"] = [rec["hidden_states"][self.ds.layers.index(k)] for k in self.e3_layers]
                out["final"] = (rec.get("final") or {}).get(self.final_kind)
            for k, t in zip(self.ds.layers, rec["hidden_states"]):
                out["others"][f"layer {k}"] = t
            for kind, t in (rec.get("final") or {}).items():
                out["others"][f"final/{kind}"] = t
        else:
            for k, t in zip(self.e3_layers, out["aux"]):
                out["others"][f"layer {k}"] = t
            if out["final"] is not None:
                out["others"][f"final/{self.final_kind}"] = out["final"]
        return out


def split_record(rec: dict, k: int) -> tuple:
    """A SpecForge record's layer states (a list of k [T, H]) and its final state ([T, H], or
    None): EAGLE-3's `aux_hidden_state` [1, T, k*H] and `hidden_state`, or the DFlash family's
    `hidden_states` [T, k*H] and (DSpark) `target_last_hidden_states`."""
    import torch

    if "aux_hidden_state" in rec:
        aux, final = rec["aux_hidden_state"], rec["hidden_state"]
    else:
        aux, final = rec["hidden_states"], rec.get("target_last_hidden_states")
    aux = aux.reshape(-1, aux.shape[-1])
    H = aux.shape[-1] // k
    return list(torch.split(aux, H, dim=-1)), (None if final is None else final.reshape(-1, H))


def load_ckpt(folder: Path, pos: int) -> dict:
    import torch

    g = pos - pos % GROUP
    return torch.load(folder / f"rows_{g}-{g + GROUP}" / f"data_{pos}.ckpt", weights_only=True)


class SpecForgeSide:
    """SpecForge's records (the `specforge` step's folder, or an hsdump export)."""

    def __init__(self, path: str):
        p = Path(path)
        self.path = p
        if (p / "reference_capture.json").exists():
            self.state = json.loads((p / "reference_capture.json").read_text())
            self.sglang_ids = self.state["sglang_layer_ids"]
            self.layers = None  # SGLang ids only; matched to hsdump's by its serving ids
            self.what = "specforge"
        elif (p / "hsdump_export.json").exists():
            self.state = json.loads((p / "hsdump_export.json").read_text())
            self.sglang_ids = self.state.get("serving_ids")
            self.layers = [int(k) for k in self.state["kind_layers"]]
            self.what = "hsdump export"
        else:
            raise SystemExit(f"{p}: no reference_capture.json or hsdump_export.json")
        self.ids = [int(i) for i in self.state["ids"]]

    def get(self, pos: int) -> dict:

        rec = load_ckpt(self.path, pos)
        aux, final = split_record(rec, len(self.layers or self.sglang_ids))
        return {
            "input_ids": rec["input_ids"].reshape(-1),
            "loss_mask": rec["loss_mask"].reshape(-1),
            "aux": aux,
            "final": final,
            "shapes": {k: list(v.shape) for k, v in rec.items()},
            "dtypes": {k: str(v.dtype).replace("torch.", "") for k, v in rec.items()},
        }


# ----------------------------------------------------------------------------- metrics
def rel(b, a) -> float:
    """||b - a|| / ||b|| in float32 (b: SpecForge's, the reference)."""
    b, a = b.float(), a.float()
    d = float((b - a).norm())
    n = float(b.norm())
    return d / n if n else (0.0 if d == 0 else float("inf"))


def tensor_metrics(b, a, others: Dict[str, object]) -> dict:
    """SpecForge tensor `b` [n_b, H] against hsdump's `a` [n_a, H] on their common rows."""
    n = min(b.shape[0], a.shape[0])
    bb, aa = b[:n].float(), a[:n].float()
    diff = bb - aa
    row_den = bb.norm(dim=-1).clamp_min(1e-30)
    row_rel = diff.norm(dim=-1) / row_den
    worst = int(row_rel.argmax())
    out = {
        "rows": n,
        "rel": rel(bb, aa),
        # real activations carry an attention sink on row 0 (|x| ~ 25,000 in SmolLM2, most of
        # a layer's squared norm), which the whole-tensor error mostly measures
        "rel_without_row0": rel(bb[1:], aa[1:]) if n > 1 else None,
        "max_abs": float(diff.abs().max()),
        "ref_max_abs": float(bb.abs().max()),
        "row0_rel": float(row_rel[0]),
        "last_row_rel": float(row_rel[n - 1]),
        "worst_row": worst,
        "worst_row_rel": float(row_rel[worst]),
        "rows_over_0.05": int((row_rel > 0.05).sum()),
    }
    if n > 1:
        out["shift_sf_later_rel"] = rel(bb[1:], aa[:-1])  # sf row t+1 against hs row t
        out["shift_sf_earlier_rel"] = rel(bb[:-1], aa[1:])
    # the closest hsdump tensor, over the rows after the first: row 0 (the attention sink)
    # is nearly the same vector in neighbouring layers and would blur an off-by-one layer
    lo = 1 if n > 1 else 0
    best, best_rel, near = None, None, {}
    for name, t in others.items():
        if t is None or t.shape[-1] != b.shape[-1]:
            continue
        r = rel(bb[lo:], t[lo:n])
        near[name] = r
        if best_rel is None or r < best_rel:
            best, best_rel = name, r
    out["closest"] = best
    out["closest_rel"] = best_rel
    out["against"] = near
    return out


class Transformers:
    """A float32 transformers forward of the same ids (hsdump.check's reference: the
    checkpoint's own class, the final norm's input and output hooked): which side a difference
    comes from."""

    def __init__(self, model: str):
        import torch

        from hsdump.check import reference_model

        self.model = reference_model(model, torch.float32)
        self.path = model

    def states(self, ids) -> dict:
        from hsdump.check import forward

        f = forward(self.model, [int(x) for x in ids.reshape(-1).tolist()], "cpu")
        got = {f"layer {k}": t for k, t in enumerate(f.hidden_states[:-1])}
        got["final/post_norm"] = f.post_norm
        got["final/pre_norm"] = f.pre_norm
        return got


def against_transformers(ref: dict, pairs: Dict[str, tuple]) -> dict:
    """{tensor: {specforge, hsdump, ..._without_row0}}: each side's error against `ref`."""
    out = {}
    for name, (hf_name, b, a) in pairs.items():
        r = ref.get(hf_name)
        if r is None or a is None:
            continue
        n = min(a.shape[0], r.shape[0])
        out[name] = {
            "transformers": hf_name,
            "specforge": rel(r[:n], b[:n]),
            "hsdump": rel(r[:n], a[:n]),
            "specforge_without_row0": rel(r[1:n], b[1:n]),
            "hsdump_without_row0": rel(r[1:n], a[1:n]),
        }
    return out


def compare(
    hs: HsdumpSide,
    sf: SpecForgeSide,
    limit: Optional[int] = None,
    hf_samples: int = 0,
    hf_model: Optional[str] = None,
) -> dict:
    import torch

    hf = None
    if hf_samples:
        hf_model = hf_model or (hs.facts or {}).get("model")
        if not hf_model:
            raise SystemExit("--hf needs the model folder (--model, or a dataset manifest)")
        from hsdump.tiny import resolve_model_path

        hf = Transformers(resolve_model_path(hf_model))

    if sf.ids != hs.ids[: len(sf.ids)]:
        common = [i for i in sf.ids if i in set(hs.ids)]
        note = f"SpecForge holds ids {sf.ids[:8]}..., hsdump {hs.ids[:8]}...; {len(common)} common"
    else:
        note = None
    # SpecForge's aux slot j -> hsdump's EAGLE-3 layer: by SGLang id when both are known
    K = len(hs.e3_layers)
    pairing = list(range(K))
    if sf.layers is not None:
        pairing = [hs.e3_layers.index(k) if k in hs.e3_layers else None for k in sf.layers]
    elif hs.serving_ids and sf.sglang_ids:
        # by SGLang id; an id hsdump's serving ids lack is paired by position, so that the
        # closest-tensor column shows which layer SpecForge's capture really holds
        pairing = [
            hs.serving_ids.index(s) if s in hs.serving_ids else (j if j < K else None)
            for j, s in enumerate(sf.sglang_ids)
        ]
    ids_match = bool(sf.sglang_ids == hs.serving_ids) if sf.layers is None else None
    hs_pos = {sid: i for i, sid in enumerate(hs.ids)}
    samples = []
    positions = range(len(sf.ids)) if limit is None else range(min(limit, len(sf.ids)))
    for pos in positions:
        sid = sf.ids[pos]
        if sid not in hs_pos:
            samples.append({"position": pos, "id": sid, "missing_in_hsdump": True})
            continue
        a = hs.get(hs_pos[sid])
        b = sf.get(pos)
        na, nb = int(a["input_ids"].numel()), int(b["input_ids"].numel())
        n = min(na, nb)
        pad = nb - na
        s = {
            "position": pos,
            "id": sid,
            "rows_hsdump": na,
            "rows_specforge": nb,
            "pad_rows": pad,
            "aux_rows_specforge": int(b["aux"][0].shape[0]),
            "final_rows_specforge": None if b["final"] is None else int(b["final"].shape[0]),
            "ids_equal": bool(torch.equal(b["input_ids"][:n], a["input_ids"][:n].to(torch.int64)))
            and nb >= na,
            "loss_mask_equal": bool(
                torch.equal(b["loss_mask"][:n].to(torch.int64), a["loss_mask"][:n].to(torch.int64))
            )
            and nb >= na,
            "masked_hsdump": int(a["loss_mask"].sum()),
            "masked_specforge": int(b["loss_mask"].sum()),
            "shapes_specforge": b["shapes"],
            "dtypes_specforge": b["dtypes"],
            "tensors": {},
        }
        # SpecForge's EAGLE-3 normalizer (normalize_offline_sample) zeroes the record's last
        # loss-mask entry, and its trainer pairs row t with token t+1 and target row t+1: on a
        # padded record the last real row stays in the loss and is paired with a pad row
        norm_b = b["loss_mask"].to(torch.int64).clone()
        norm_b[-1] = 0
        norm_a = a["loss_mask"].to(torch.int64).clone()
        norm_a[-1] = 0
        s["trained_rows_specforge"] = int(norm_b.sum())
        s["trained_rows_hsdump"] = int(norm_a.sum())
        s["trained_rows_paired_with_pad"] = int(norm_b[max(na - 1, 0) : na].sum()) if pad > 0 else 0
        if pad > 0:
            s["pad_ids"] = sorted({int(x) for x in b["input_ids"][na:].tolist()})
            s["pad_loss_mask_sum"] = int(b["loss_mask"][na:].sum())
            s["pad_rows_aux_rms"] = float(b["aux"][0][na:].float().pow(2).mean().sqrt())
            finals = [] if b["final"] is None else [b["final"]]
            if finals:
                s["pad_rows_final_rms"] = float(b["final"][na:].float().pow(2).mean().sqrt())
            s["pad_rows_nonzero"] = bool(
                any(float(t[na:].abs().max()) > 0 for t in b["aux"] + finals)
            )
        for j, t in enumerate(b["aux"]):
            k = pairing[j] if j < len(pairing) else None
            label = f"aux {j}"
            if k is None:
                s["tensors"][label] = {"unpaired": True}
                continue
            m = tensor_metrics(t, a["aux"][k], a["others"])
            m["hsdump_layer"] = hs.e3_layers[k]
            m["sglang_id"] = sf.sglang_ids[j] if sf.sglang_ids else None
            s["tensors"][label] = m
        if a["final"] is not None and b["final"] is not None:
            m = tensor_metrics(b["final"], a["final"], a["others"])
            m["hsdump_tensor"] = f"final/{hs.final_kind}"
            s["tensors"]["final"] = m
        if hf is not None and pos < hf_samples:
            pairs = {
                f"aux {j}": (f"layer {hs.e3_layers[pairing[j]]}", t, a["aux"][pairing[j]])
                for j, t in enumerate(b["aux"])
                if j < len(pairing) and pairing[j] is not None
            }
            if b["final"] is not None:
                pairs["final"] = (f"final/{hs.final_kind}", b["final"], a["final"])
            s["transformers_float32"] = against_transformers(hf.states(a["input_ids"]), pairs)
        samples.append(s)
    return {
        "hsdump": str(hs.path),
        "hsdump_dataset": hs.dataset,
        "specforge": str(sf.path),
        "specforge_is": sf.what,
        "hsdump_eagle3_layers": hs.e3_layers,
        "hsdump_serving_ids": hs.serving_ids,
        "hsdump_captured_layers": hs.all_layers,
        "hsdump_final_kind": hs.final_kind,
        "specforge_sglang_ids": sf.sglang_ids,
        "pairing": pairing,
        "sglang_ids_match": ids_match,
        "ids_note": note,
        "transformers_float32": hf.path if hf is not None else None,
        "samples": samples,
        "summary": summarize(samples),
    }


def summarize(samples: List[dict]) -> dict:
    ok = [s for s in samples if "tensors" in s]
    out: Dict[str, object] = {
        "samples": len(samples),
        "compared": len(ok),
        "missing_in_hsdump": len(samples) - len(ok),
        "ids_equal": sum(s["ids_equal"] for s in ok),
        "loss_mask_equal": sum(s["loss_mask_equal"] for s in ok),
        "rows_equal": sum(s["rows_hsdump"] == s["rows_specforge"] for s in ok),
        "samples_with_pad_rows": sum(s["pad_rows"] > 0 for s in ok),
        "pad_rows": sum(max(s["pad_rows"], 0) for s in ok),
        "samples_short": sum(s["pad_rows"] < 0 for s in ok),
        "pad_rows_nonzero": sum(bool(s.get("pad_rows_nonzero")) for s in ok),
        "real_rows": sum(s["rows_hsdump"] for s in ok),
        "trained_rows_specforge": sum(s["trained_rows_specforge"] for s in ok),
        "trained_rows_hsdump": sum(s["trained_rows_hsdump"] for s in ok),
        "trained_rows_paired_with_pad": sum(s["trained_rows_paired_with_pad"] for s in ok),
    }
    tensors: Dict[str, dict] = {}
    names = sorted({k for s in ok for k in s["tensors"]}, key=lambda x: (x == "final", x))
    for name in names:
        ms = [(s, s["tensors"][name]) for s in ok if name in s["tensors"]]
        ms = [(s, m) for s, m in ms if "rel" in m]
        if not ms:
            continue
        worst_s, worst_m = max(ms, key=lambda sm: sm[1]["rel"])
        wr_s, wr_m = max(ms, key=lambda sm: sm[1]["worst_row_rel"])
        closest = {}
        for _, m in ms:
            closest[m["closest"]] = closest.get(m["closest"], 0) + 1
        t = {
            "hsdump": worst_m.get("hsdump_tensor") or f"layer {worst_m.get('hsdump_layer')}",
            "sglang_id": worst_m.get("sglang_id"),
            "rel_worst": worst_m["rel"],
            "rel_worst_id": worst_s["id"],
            "rel_median": statistics.median(m["rel"] for _, m in ms),
            "rel_without_row0_worst": max(
                (m["rel_without_row0"] for _, m in ms if m["rel_without_row0"] is not None),
                default=None,
            ),
            "max_abs": max(m["max_abs"] for _, m in ms),
            "ref_max_abs": max(m["ref_max_abs"] for _, m in ms),
            "row0_rel_worst": max(m["row0_rel"] for _, m in ms),
            "last_row_rel_worst": max(m["last_row_rel"] for _, m in ms),
            "worst_row_rel": wr_m["worst_row_rel"],
            "worst_row": f"id {wr_s['id']} row {wr_m['worst_row']} of {wr_m['rows']}",
            "rows_over_0.05": sum(m["rows_over_0.05"] for _, m in ms),
            "shift_rel_min": min(
                min(m.get("shift_sf_later_rel", 9e9), m.get("shift_sf_earlier_rel", 9e9))
                for _, m in ms
            ),
            "closest": closest,
        }
        for other in sorted({k for _, m in ms for k in m["against"]}):
            vals = [m["against"][other] for _, m in ms if other in m["against"]]
            t.setdefault("against_median", {})[other] = statistics.median(vals)
        tensors[name] = t
    out["tensors"] = tensors
    hf = [x["transformers_float32"] for x in ok if "transformers_float32" in x]
    if hf:
        agg = {}
        for name in tensors:
            vals = [x[name] for x in hf if name in x]
            if vals:
                agg[name] = {"transformers": vals[0]["transformers"], "samples": len(vals)} | {
                    k: max(v[k] for v in vals)
                    for k in (
                        "specforge",
                        "hsdump",
                        "specforge_without_row0",
                        "hsdump_without_row0",
                    )
                }
        out["transformers_float32"] = agg
    return out


# ----------------------------------------------------------------------------- report
def _f(x, p=4) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        if x == 0:
            return "0"
        return f"{x:.{p}f}" if abs(x) >= 10**-p else f"{x:.1e}"
    return str(x)


def _around(name: str, t: dict) -> str:
    """The median error against the neighbouring captured tensors (layer k-1, k+1, the other
    final kind), to see at a glance that the paired one is the match."""
    med = t.get("against_median") or {}
    if name.startswith("aux"):
        k = int(t["hsdump"].split()[-1])
        keys = [f"layer {k - 1}", f"layer {k + 1}"]
    else:
        keys = [x for x in med if x.startswith("final/") and x != t["hsdump"]]
    return ", ".join(f"{x}: {_f(med[x], 3)}" for x in keys if x in med) or "-"


def table(res: dict) -> str:
    s = res["summary"]
    head = []
    if res.get("sglang_ids_match") is False:
        head = [
            f"SpecForge captured SGLang ids {res['specforge_sglang_ids']}, hsdump's EAGLE-3 "
            f"serving ids are {res['hsdump_serving_ids']}: aux slots paired by position.",
            "",
        ]
    lines = head + [
        f"{s['compared']} samples, {s['real_rows']} real rows; ids equal {s['ids_equal']}/"
        f"{s['compared']}, loss masks equal {s['loss_mask_equal']}/{s['compared']}, rows equal "
        f"{s['rows_equal']}/{s['compared']}; SpecForge records with pad rows: "
        f"{s['samples_with_pad_rows']} ({s['pad_rows']} rows, nonzero states on them in "
        f"{s['pad_rows_nonzero']}); shorter than hsdump's: {s['samples_short']}. Loss rows "
        "after SpecForge's EAGLE-3 normalizer's rule (last entry zeroed; the DFlash family's "
        "normalizer has its own): "
        f"{s['trained_rows_specforge']} on SpecForge's records, {s['trained_rows_hsdump']} on "
        f"hsdump's; last real row still in the loss (paired with a pad row): "
        f"{s['trained_rows_paired_with_pad']}.",
        "",
        "| SpecForge tensor | hsdump tensor | rel. error worst (median) | without row 0, worst | "
        "max abs diff (max abs value) | row 0 worst | last row worst | worst row | rows > 0.05 | "
        "shifted one row | closest hsdump tensor (rows 1..) | neighbours (median, rows 1..) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, t in s["tensors"].items():
        sid = f" (SGLang id {t['sglang_id']})" if t.get("sglang_id") is not None else ""
        closest = ", ".join(f"{k} x{v}" for k, v in sorted(t["closest"].items(), key=str))
        lines.append(
            f"| {name}{sid} | {t['hsdump']} | {_f(t['rel_worst'])} ({_f(t['rel_median'])}) | "
            f"{_f(t['rel_without_row0_worst'])} | "
            f"{_f(t['max_abs'], 3)} ({_f(t['ref_max_abs'], 1)}) | {_f(t['row0_rel_worst'])} | "
            f"{_f(t['last_row_rel_worst'])} | {_f(t['worst_row_rel'])}: {t['worst_row']} | "
            f"{t['rows_over_0.05']} | {_f(t['shift_rel_min'], 3)} | {closest} | "
            f"{_around(name, t)} |"
        )
    if s.get("transformers_float32"):
        tf = s["transformers_float32"]
        k = next(iter(tf.values()))["samples"]
        lines += [
            "",
            f"Each side against a float32 transformers forward of the same ids (first {k} "
            "samples; worst relative error, with the reference's norm):",
            "",
            "| tensor | transformers | SpecForge | hsdump | SpecForge without row 0 | "
            "hsdump without row 0 |",
            "|---|---|---|---|---|---|",
        ]
        for name, t in tf.items():
            lines.append(
                f"| {name} | {t['transformers']} | {_f(t['specforge'])} | {_f(t['hsdump'])} | "
                f"{_f(t['specforge_without_row0'])} | {_f(t['hsdump_without_row0'])} |"
            )
    lines += [
        "",
        "| pos | id | rows hsdump | rows SpecForge (pad) | ids | mask | "
        + " | ".join(s["tensors"].keys())
        + " |",
        "|---|---|---|---|---|---|" + "---|" * len(s["tensors"]),
    ]
    for x in res["samples"]:
        if "tensors" not in x:
            lines.append(f"| {x['position']} | {x['id']} | missing in hsdump |")
            continue
        cells = [
            _f(x["tensors"].get(k, {}).get("rel")) if "rel" in x["tensors"].get(k, {}) else "-"
            for k in s["tensors"]
        ]
        lines.append(
            f"| {x['position']} | {x['id']} | {x['rows_hsdump']} | {x['rows_specforge']} "
            f"({x['pad_rows']}) | {'=' if x['ids_equal'] else 'DIFF'} | "
            f"{'=' if x['loss_mask_equal'] else 'DIFF'} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines) + "\n"
