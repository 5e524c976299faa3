"""Issue 73's run in one command: train while capturing with EAGLE-3, beside its offline twin,
both drafters served and paired.

    python3 bench/online_gpu.py --work /tmp/onl --data .acc/data --out $OUT/onl \\
        --model smollm2_135m --engine gpu --samples 2000 --epochs 2

The steps, each skipped when its output exists (a second call resumes), each logged to
OUT/STEP.log as it runs:

1. `regen`: extract.py regenerates the answers of --samples prompts of DATA/train.jsonl with the
   target (greedy, --max-new-tokens), as the acceptance runs do;
2. `messages`: `hsdump export --to messages` of that capture: the conversations every later
   capture reads (the online mode does not regenerate);
3. `bench`: `bench/online_bench.py --kind eagle3` on them: the offline twin (capture alone,
   export, SpecForge's offline trainer), then the capture into the online folder under the cap
   beside SpecForge's online consumer, the trainer SIGKILLed after --kill-trainer-at and
   resumed, the capture SIGKILLed after --kill-capture-at published and started again;
4. `export-online`, `export-offline`: SpecForge's export of each run's last checkpoint;
5. `serve-online`, `serve-offline`: each drafter served by SGLang on the first --prompts
   held-out prompts of DATA/heldout.jsonl (greedy, batched; a GPU only: the CPU engine has no
   speculative path);
6. `pair`: `bench/online_pair.py`: OUT/online.json, the online drafter's accept length minus
   the offline one's, paired, with its 95 % interval, beside the bench's figures.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# SpecForge's and accelerate's roots unless given: where `make test` unpacks their wheels
PEERS = Path(os.environ.get("HSDUMP_CACHE", Path.home() / ".cache" / "hsdump")) / "peers"


ENV = dict(os.environ)  # main puts SpecForge and accelerate first on its PYTHONPATH


def step(out: Path, name: str, cmd: list, done: Path) -> None:
    """Run `cmd` unless `done` exists; its output to OUT/NAME.log; a failure stops the run."""
    if done.exists():
        print(f"[online_gpu] {name}: done before ({done})", flush=True)
        return
    t = time.time()
    with open(out / f"{name}.log", "w") as log:
        rc = subprocess.call([str(c) for c in cmd], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                             env=ENV)  # fmt: skip
    print(f"[online_gpu] {name}: rc {rc} in {time.time() - t:.0f} s", flush=True)
    if rc:
        tail = (out / f"{name}.log").read_text()[-3000:]
        raise SystemExit(f"online_gpu: step {name} failed (rc {rc}):\n{tail}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", required=True)
    ap.add_argument("--data", required=True, help="a folder with train.jsonl and heldout.jsonl")
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="smollm2_135m", help="the target's conf/model preset")
    ap.add_argument("--engine", default="gpu", choices=("gpu", "cpu"))
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--max-len", type=int, default=1024)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--cap", type=int, default=0, help="bytes (0: online_bench's, twice the least)")
    ap.add_argument("--kill-trainer-at", type=int, default=50)
    ap.add_argument("--kill-capture-at", type=int, default=0,
                    help="published samples (0: two thirds of the first epoch's and a half)")  # fmt: skip
    ap.add_argument("--engine-memory", type=float, default=0.5,
                    help="the captures' engine.mem_fraction_static (engine=gpu: SGLang's share of "
                    "the GPU the trainer shares; its default 0.8 leaves the trainer 0.2)")  # fmt: skip
    ap.add_argument("--prompts", type=int, default=256)
    ap.add_argument("--serve-new-tokens", type=int, default=192)
    ap.add_argument("--specforge", default=os.environ.get("HSDUMP_SPECFORGE_SRC"),
                    help="SpecForge 0.2.0's root (default: online_bench's)")  # fmt: skip
    ap.add_argument("--accelerate", default=os.environ.get("HSDUMP_ACCELERATE_SRC"))
    a = ap.parse_args(argv)
    import yaml

    from hsdump.tiny import resolve_model_path

    a.specforge = a.specforge or str(PEERS / "specforge-0.2.0")
    a.accelerate = a.accelerate or str(PEERS / "accelerate-1.15.0")
    had = [x for x in ENV.get("PYTHONPATH", "").split(os.pathsep) if x]
    ENV["PYTHONPATH"] = os.pathsep.join([a.specforge, a.accelerate, *had, str(ROOT)])

    w, out, data = Path(a.work), Path(a.out), Path(a.data).resolve()
    w.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    preset = yaml.safe_load((ROOT / "conf" / "model" / f"{a.model}.yaml").read_text())
    target = resolve_model_path(preset["path"])
    regen, msgs = w / "regen", w / "messages" / "conversations.jsonl"
    step(out, "regen", [py, "extract.py", f"model={a.model}", f"engine={a.engine}",
                        f"dataset.path={data / 'train.jsonl'}", "dataset.format=sharegpt",
                        f"dataset.max_samples={a.samples}", f"dataset.max_seq_len={a.max_len}",
                        "regenerate=last", f"regenerate.max_new_tokens={a.max_new_tokens}",
                        "capture.kinds=[eagle3]", "capture.final=[post_norm]", "progress=false",
                        f"output.dir={regen}"], regen / "index.json")  # fmt: skip
    step(out, "messages", [py, "-m", "hsdump", "export", regen, msgs.parent, "--to", "messages",
                           "--no-progress"], msgs)  # fmt: skip
    n = sum(1 for line in msgs.open() if line.strip())
    kill_capture = a.kill_capture_at or max(1, (3 * n) // 2)  # mid-way through the second epoch
    bench = out / "online-bench.json"
    step(out, "bench", [py, "bench/online_bench.py", "--kind", "eagle3", "--engine", a.engine,
                        "--model", a.model, "--data", msgs, "--samples", n, "--epochs", a.epochs,
                        "--batch", a.batch, "--max-len", a.max_len, "--cap", a.cap,
                        "--runs", "capped", "--kill-trainer-at", a.kill_trainer_at,
                        "--kill-capture-at", kill_capture, "--pace", "0", "--timeout", 7200,
                        "--specforge", a.specforge, "--accelerate", a.accelerate,
                        "--work", w / "bench", "--out", bench,
                        *(["--capture-arg", f"engine.mem_fraction_static={a.engine_memory}"]
                          if a.engine == "gpu" else [])], bench)  # fmt: skip
    served = {}
    for name, run in (("online", "capped"), ("offline", "offline")):
        served[name] = w / "served" / name
        step(out, f"export-{name}", [py, "-m", "bench.acceptance", "export", "--kind", "eagle3",
                                     "--ckpt", w / "bench" / run / "train" / "run",
                                     "--draft-config", w / "bench" / "offline" / "draft.json",
                                     "--target", target, "--out", served[name]],
             served[name] / "config.json")  # fmt: skip
    if a.engine != "gpu":
        print("[online_gpu] serve and pair: a GPU only (SGLang's CPU engine has no speculative "
              "path); the drafters are exported under " + str(w / "served"), flush=True)  # fmt: skip
        return 0
    for name in served:
        step(out, f"serve-{name}", [py, "-m", "bench.acceptance.speculators", "serve",
                                    "--target", target, "--heldout", data / "heldout.jsonl",
                                    "--name", name, "--drafter", served[name],
                                    "--algorithm", "EAGLE3", "--limit", a.prompts,
                                    "--batch1", 0, "--max-new-tokens", a.serve_new_tokens,
                                    "--json", out / f"serve-{name}.json"],
             out / f"serve-{name}.json")  # fmt: skip
    step(out, "pair", [py, "bench/online_pair.py", "--bench", bench,
                       "--online", out / "serve-online.json", "--offline", out / "serve-offline.json",
                       "--out", out / "online.json", "--min-prompts", a.prompts],
         out / "online.json")  # fmt: skip
    print((out / "pair.log").read_text().strip(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
