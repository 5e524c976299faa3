"""README's model-family table, generated from the recorded results.

Rows: every architecture the installed SGLang registers with EAGLE-3 aux capture
(`set_eagle3_layers_to_capture`), every class of hsdump.testing.families, and hsdump.capture.families'
verified list. Errors come from the results files: bench/results/families-cpu.json (`results`:
`bench/families_probe.py` on the CPU, SGLang 0.5.23; `gpu_preview`: the same with `--device
gpu` on one H200, SGLang 0.5.17), bench/results/families-gpu-0523.json (the same on one H200,
SGLang 0.5.23), bench/results/kimi-gpu-first.json, kimi-gpu-0523-bf16.json and kimi-gpu-0523-int4.json
(tests/test_gpu_kimi.py's checkpoint through the kimi_k25 preset) and
bench/results/gpu-check-h200.json and gpu-0523-deepseek_v3.json (tests/test_gpu.py's cases on
SGLang 0.5.17 and 0.5.23); families-cpu.json's
`refused` block gives, per class, why a target stays refused (with the SGLang version). Status is hsdump's: verified
classes are captured on the SGLang versions their check ran on (hsdump.capture.families); every
other class, and a verified one on another SGLang version, is refused before the engine starts
unless capture.allow_unverified=true.

    .venv/bin/python bench/families_table.py            # print the table
    .venv/bin/python bench/families_table.py --write    # replace it in README.md
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from hsdump.testing.families import README_TABLE

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
BEGIN, END = README_TABLE
DRAFT = re.compile(r"(Eagle3?|MTP|NextN|Assistant)")


def registered_eagle3() -> list:
    """Architectures of the installed SGLang whose class has EAGLE-3 aux capture."""
    from hsdump.capture.patch import prepare_process

    prepare_process("cpu")
    from sglang.srt.models.registry import ModelRegistry

    ModelRegistry.get_supported_archs()
    return sorted(
        a for a, cls in ModelRegistry.models.items() if hasattr(cls, "set_eagle3_layers_to_capture")
    )


def measured() -> dict:
    """{architecture: [(where, worst, bf16 worst, status)]} from the results files."""
    out: dict = {}
    from hsdump.testing.families import FAMILIES as TEST_FAMILIES

    fam = json.loads((RESULTS / "families-cpu.json").read_text())
    gpu23 = json.loads((RESULTS / "families-gpu-0523.json").read_text())
    for block, where in (
        (fam["results"], "CPU, SGLang 0.5.23"),
        (fam.get("gpu_preview", {}).get("results", {}), "H200, SGLang 0.5.17"),
        (gpu23["results"], "H200, SGLang 0.5.23"),
    ):
        for name, r in block.items():
            status = r.get("status", "?")
            if status.startswith("wrong") and r.get("moe_rule_ok"):
                status = "ok (MoE rule)"
            out.setdefault(TEST_FAMILIES[name].cls, []).append(
                (where, r.get("worst"), r.get("bf16_worst"), status)
            )
    # the Kimi-K2.5 checkpoint's runs (tests/test_gpu_kimi.py's check): SGLang 0.5.17 (kimi-gpu-first.json), 0.5.23 bf16
    # (gpu-0523-second.json) and INT4 (gpu-0523-fourth.json: its first forward JIT-builds
    # SGLang's Marlin MoE kernels, 11 min on a fresh host, run as a bg step)
    for name, version in (
        ("kimi-gpu-first.json", "0.5.17"),
        ("kimi-gpu-0523-bf16.json", "0.5.23"),
        ("kimi-gpu-0523-int4.json", "0.5.23"),
    ):
        for r in json.loads((RESULTS / name).read_text())["runs"]:
            worst = max(v["worst"] for v in r["per_layer"].values())
            bf16 = max(v["bf16_worst"] for v in r["per_layer"].values())
            # "status" is the per-sample rule's verdict; the first run did not record the MoE
            # rule's mean part, so its worst-sample part is applied here
            if r["status"] == "ok":
                status = "ok"
            elif worst <= 3 * bf16 + 0.005:
                status = "ok by the MoE rule's worst-sample part"
            else:
                status = "wrong"
            out.setdefault("KimiK25ForConditionalGeneration", []).append(
                (
                    f"H200, SGLang {version}, " + ("INT4 experts" if r["int4"] else "bf16"),
                    worst,
                    bf16,
                    status,
                )
            )
    for name, case, arch in (
        ("gpu-check-h200.json", "llama", "LlamaForCausalLM"),
        ("gpu-0523-llama.json", "llama", "LlamaForCausalLM"),
        ("gpu-check-h200.json", "deepseek_v3", "DeepseekV3ForCausalLM"),
        ("gpu-0523-deepseek_v3.json", "deepseek_v3", "DeepseekV3ForCausalLM"),
    ):
        res = json.loads((RESULTS / name).read_text())
        env = res.get("env") or res["env_run2"]
        check = res["cases"][case]
        s = check["summary"].values()
        out.setdefault(arch, []).append(
            (
                f"H200, SGLang {env['sglang']} (tests/test_gpu.py)",
                max(v["sglang_max"] for v in s),
                max(v["hf_bf16_max"] for v in s),
                "ok" if not check["tolerance_failures"] else "wrong",
            )
        )
    return out


def refusals() -> dict:
    """{architecture: why it stays refused} from families-cpu.json's `refused` block: the
    targets that could not be verified, each with the SGLang version the reason holds for."""
    fam = json.loads((RESULTS / "families-cpu.json").read_text())
    return {
        arch: f"{r['reason']} (SGLang {r['sglang']})".replace("|", "/")
        for arch, r in fam.get("refused", {}).items()
    }


def _fmt(x) -> str:
    return "" if x is None else f"{x:.4f}"


def table(archs=None) -> str:
    from hsdump.capture.families import family_of
    from hsdump.testing.families import FAMILIES as TEST_FAMILIES

    archs = set(archs if archs is not None else registered_eagle3())
    archs |= {f.cls for f in TEST_FAMILIES.values()}
    seen = measured()
    why = refusals()
    archs |= set(seen) | set(why)
    rows = []
    for arch in sorted(archs):
        fam = family_of(arch)
        runs = seen.get(arch, [])
        ran = "; ".join(f"{w}: {s[:60]}" for w, _, _, s in runs) or "not run"
        best = [r for r in runs if r[3].startswith("ok")]
        err = f"{_fmt(best[-1][1])} / {_fmt(best[-1][2])}" if best else ""
        if fam is not None:
            on = "; ".join(f"SGLang {v} ({w})" for v, w in fam.runs)
            status = f"**verified** on {on}"
        elif DRAFT.search(arch):
            status = "draft / MTP module: not a capture target"
        elif arch in why:
            status = f"refused unless capture.allow_unverified=true: {why[arch]}"
        else:
            status = "refused unless capture.allow_unverified=true"
        rows.append((fam is None, arch, fam.name if fam else "", ran, err, status))
    rows.sort()
    lines = [
        "| SGLang class | family | where it ran: result | worst error / transformers' "
        "own bf16 | hsdump |",
        "|---|---|---|---|---|",
    ]
    for _, arch, name, ran, err, status in rows:
        lines.append(f"| `{arch}` | {name} | {ran.replace('|', '/')} | {err} | {status} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    text = table()
    if "--write" not in argv:
        print(text)
        return 0
    readme = ROOT / "README.md"
    body = readme.read_text()
    i, j = body.index(BEGIN), body.index(END)
    readme.write_text(body[: i + len(BEGIN)] + "\n" + text + "\n" + body[j:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
