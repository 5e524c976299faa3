"""Issue 73's results JSON: `bench/online_bench.py`'s run beside the two drafters it trained
(online and offline, same samples, same order), each served by SGLang on the same held-out
prompts (`python3 -m bench.acceptance.speculators serve --json`): the online drafter's accept
length minus the offline one's, paired over the prompts, with a 95 % bootstrap interval.

    python3 bench/online_pair.py --bench B.json --online serve-online.json \\
        --offline serve-offline.json --out bench/results/online-gpu.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench")]

# what the results keep of the bench's JSON, in the order
KEEP = ("consumer", "specforge_version", "kind", "engine", "gpu", "cap_bytes", "peak_bytes",
        "bytes_published", "epochs", "samples_published", "samples_consumed", "waits",
        "capture_tokens_per_s", "kills", "loss_equal_to_offline", "loss_max_abs_diff_to_offline",
        "steps", "settings")  # fmt: skip


def pair(online: dict, offline: dict, draws: int = 2000) -> dict:
    """online minus offline accept length over the prompts both served (their per_prompt:
    completion tokens and verify steps), as bench/acceptance/table.py pairs two drafters."""
    from bench.acceptance.table import paired

    got = paired({"default": online, "offline": offline}, draws=draws).get("offline")
    if not got:
        raise SystemExit("online_pair: no prompt served by both (each serve JSON's per_prompt)")
    return dict(mean=got["default_minus_this"], ci95=got["ci95"], prompts=got["prompts"],
                prompts_online_higher=got["prompts_default_higher"],
                prompts_online_lower=got["prompts_default_lower"],
                online_accept_length=online["batched"]["accept_length"],
                offline_accept_length=offline["batched"]["accept_length"])  # fmt: skip


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", required=True, help="bench/online_bench.py's --out")
    ap.add_argument("--online", required=True, help="the online drafter's serve JSON")
    ap.add_argument("--offline", required=True, help="the offline drafter's serve JSON")
    ap.add_argument("--out", required=True)
    ap.add_argument("--min-prompts", type=int, default=256)
    a = ap.parse_args(argv)
    b = json.loads(Path(a.bench).read_text())
    on, off = (json.loads(Path(p).read_text()) for p in (a.online, a.offline))
    res = {k: b.get(k) for k in KEEP}
    # EAGLE-3's online map, built by the consumer from the capture's counts, against SpecForge's
    res["vocab_map_equal_to_offline"] = (
        b.get("runs", {}).get("capped", {}).get("vocab_map_equal_to_offline")
    )
    res["online_minus_offline"] = pair(on, off)
    n = res["online_minus_offline"]["prompts"]
    if n < a.min_prompts:  # written, and said: the issue asks for at least 256
        print(f"online_pair: {n} prompts served by both, fewer than --min-prompts {a.min_prompts}")
    res["level"] = (
        res["online_minus_offline"]["ci95"][0] <= 0 <= res["online_minus_offline"]["ci95"][1]
    )
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    m = res["online_minus_offline"]
    print(f"online - offline accept length: {m['mean']:+.4f} (95 % {m['ci95'][0]:+.4f}.."
          f"{m['ci95'][1]:+.4f}) over {n} prompts; wrote {a.out}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
