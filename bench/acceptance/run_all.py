"""run-all: every drafter kind SGLang serves, trained by SpecForge on hsdump's exports (issue 43).

SmolLM2-135M-Instruct rewrites ShareGPT prompts (`regenerate=last`); one hsdump capture of the
union of the kinds' layers and both final states (`capture=all_kinds`) feeds EAGLE-3, DFlash and
DSpark; a second capture, of the same rewritten conversations with every kind's layers one off,
feeds the controls. For each kind (DFlash first, then EAGLE-3, then DSpark: the order of value;
EAGLE-3 also gets the wrong-template control: the same conversations captured with
deepseek_v3.jinja, hsdump's template check switched off), `hsdump export --to specforge --kind K`
writes SpecForge 0.2.0's offline records, SpecForge's own trainer (`train`: its recipe's
settings) trains the drafter and its control, SpecForge's own export writes the served folder
(`--to sglang` for EAGLE-3; `--to hf` for DFlash and DSpark, which its SGLang exporter refuses),
and SGLang serves it (`python3 -m bench.acceptance.speculators serve --algorithm
EAGLE3|DFLASH|DSPARK`) on held-out prompts, greedy, beside the plain target. Each finished row
goes into the results JSON at once.

    python3 -m bench.acceptance.speculators prepare --train 4000 --heldout 256 --out .acc/data
    python3 -m bench.acceptance run-all --work /tmp/acck --data .acc/data            # GPU

With `--reference-python PY` (issue 44), EAGLE-3 also gets a drafter trained on SpecForge 0.2.0's
own offline capture of the drafter's token ids (`bench/reference_capture.py specforge`, its own
SGLang 0.5.14 in PY); the table's `eagle3-specforge` line is hsdump's drafter minus that one, per
prompt. SpecForge is found on the Python path (README.md)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

from .capture import WRONG_TEMPLATE, capture_args, off_by_one
from .drafter import (
    ALGORITHM,
    KINDS,
    SERVED_STEPS,
    TRAINING,
    draft_config,
    drafter_options,
    export_facts,
    write_draft_config,
)
from .pipeline import ROOT, Pipeline, claim_work, dataset_facts, env_facts, overlap, run_thread
from .pipeline import python_cmd as _py
from .plan import plan_capture, spent, trace_summary, train_end, trainers_stop, training_plan
from .specforge import (
    checkpoints,
    eval_curve,
    predicted_accept_length,
    served_steps,
    step_time,
    trained,
    trainer_metrics,
)
from .speculators.convert import epochs as speculators_epochs
from .table import kv_pool_race, table
from .target import target_of
from .turns import hand_turns

ME = ("-m", "bench.acceptance")  # this package's CLI, a step of its own
SPECULATORS = ("-m", "bench.acceptance.speculators")  # the speculators pipeline's CLI


# the smoke serve (run-all): 8 prompts of 64 tokens, its KV pool capped at 60,000 tokens (about
# 1.4 GB of SmolLM2's) beside the trainers
SMOKE_SIZE = dict(new_tokens=64, batch1=1, limit=8, mem_fraction=0.95, kv_tokens=60000)
# Each served row's mem_fraction_static. Its KV pool is capped at 300,000 tokens (about 7 GB
# of SmolLM2's), so the fraction only sets SGLang's check at its start: the memory free after
# loading the weights, less (1 - fraction) of what was free before, must stay above 0. At 0.5
# the engines starting beside it may allocate up to half of what was free meanwhile; at
# 0.8 / 5 (until 2026-12-06) they could allocate only about a sixth, and two of five engines
# started together failed the check (kv_pool_race).
SERVE_MEM_FRACTION = 0.5


def setting_item(name: str, setting: str, drafter: Path) -> tuple:
    """One --serve-settings entry, STEPS,TOPK,TOKENS or STEPS,TOPK,TOKENS,gc (the engine
    freezes Python's collector after its warm-up), as a served row: (row name, algorithm,
    drafter, serve's extra arguments)."""
    f = setting.split(",")
    if len(f) not in (3, 4) or not all(x.isdigit() for x in f[:3]) or f[3:] not in ([], ["gc"]):
        raise SystemExit(f"--serve-settings {setting!r}: give STEPS,TOPK,TOKENS[,gc], e.g. 3,1,4")
    gc = ["--freeze-gc"] if f[3:] else []
    return (f"{name}-s{'-'.join(f)}", "EAGLE3", drafter, ["--spec", ",".join(f[:3]), *gc])


def run_all(a) -> int:  # noqa: C901 - one pipeline, read top to bottom
    """The GPU run, resumable (each step is skipped when its output exists): build the
    target; capture every kind's layers once (regenerated answers) and once one layer off;
    then per kind: export, train drafter and control side by side under a time budget, export
    both with SpecForge, serve (the plain target with the first kind), write the table."""
    started = time.time()
    stop_s = trainers_stop(a)  # the args stay as given (pipeline.json's args)
    if a.deadline_s is not None:
        print(f"run-all ends within {a.deadline_s:.0f} s: the trainings stop by "
              f"{stop_s:.0f} s into it", flush=True)  # fmt: skip
    if (
        not (Path(a.data) / "heldout.jsonl").exists()
        and not (Path(a.work) / "data" / "heldout.jsonl").exists()
    ):
        raise SystemExit(f"run-all: --data {a.data} holds no heldout.jsonl: "
                         "python3 -m bench.acceptance.speculators prepare --out DIR writes it")  # fmt: skip
    for x in (a.serve_settings or "").split(";"):  # a bad setting refused before the run
        if x:
            setting_item("eagle3-default", x, Path())
    w = Path(a.work).resolve()
    claim_work(w)
    a.work = str(w)
    P = Pipeline(argparse.Namespace(**{**vars(a), "work": str(w)}))
    if a.results:  # results and logs where the caller collects them (run-0523.sh bg: $OUT)
        P.res, P.logs = Path(a.results), Path(a.results) / "logs"
        P.logs.mkdir(parents=True, exist_ok=True)
    me = ME

    def run(name, cmd, env=None, done=None, check=True):
        return P.run(name, [str(c) for c in cmd], env, done, check)

    data = w / "data"  # a copy: the checkout may be synced again while this runs
    if not (data / "heldout.jsonl").exists():
        shutil.copytree(Path(a.data).resolve(), data, dirs_exist_ok=True)
    env = {"HSDUMP_CACHE": str(w / "cache"), "PYTHONUNBUFFERED": "1"}
    cpu = a.device == "cpu"
    os.environ["HSDUMP_CACHE"] = env["HSDUMP_CACHE"]
    from hsdump.capture.kinds import dflash_default
    from hsdump.capture.layers import eagle3_default

    target, model = target_of(a.target, run, env)
    if a.model_preset:  # the preset's own settings too (conf/model/NAME.yaml), not only its path
        model = [f"model={a.model_preset}"]
    L = json.loads((Path(target) / "config.json").read_text())["num_hidden_layers"]
    default = {
        "eagle3": eagle3_default(L),
        "dflash": dflash_default(L),
        "dspark": dflash_default(L),
    }
    lay = lambda k, xs: f"capture.kind_layers.{k}=[" + ",".join(map(str, xs)) + "]"  # noqa: E731
    kinds = [k for k in KINDS if k in a.kinds.split(",")]
    # every kind's layers and both final states, unless only EAGLE-3 trains without controls:
    # then its own layers and the post-norm final state (a quarter of the bytes on a 1.5B model)
    only = ["capture.kinds=[eagle3]", "capture.final=[post_norm]"]
    mine = only if a.no_controls and kinds == ["eagle3"] else ["capture=all_kinds"]
    common = [*capture_args(model, cpu, a.max_length), *mine]
    ds, ex = w / "ds", w / "ex"
    run("extract-default",
          _py("extract.py", *common, f"dataset.path={data / 'train.jsonl'}",
              "dataset.format=sharegpt", "regenerate=last",
              f"regenerate.max_new_tokens={a.max_new_tokens}",
              *([] if cpu else [f"engine.max_total_tokens={a.regen_kv_tokens}"]),
              *([f"dataset.max_samples={a.samples}"] if a.samples else []),
              f"output.dir={ds / 'default'}"),
          env=env, done=ds / "default" / "index.json")  # fmt: skip
    if a.check_samples:  # the capture's rows against transformers on this host (hsdump check)
        import shlex

        # beside the exports (the GPU has room); joined before the capture's shards go
        cj = P.res / "check-default.json"
        checking = run_thread(run, "check-default", ["bash", "-c", shlex.join(map(str, [
            *_py("-m", "hsdump"), "check", ds / "default", "--samples", a.check_samples,
            "--json"])) + f" > {shlex.quote(str(cj))}.tmp && mv {shlex.quote(str(cj))}.tmp "
            + shlex.quote(str(cj))], env, cj, False)[0]  # fmt: skip
    else:
        checking = None
    template = "eagle3" in kinds and not a.no_template_control and not a.no_controls
    # the controls' capture holds what this run's kinds read: their layers one off, and the
    # post-norm final state where a kind trains on it (SpecForge's EAGLE-3 and DSpark)
    ctl_final = ["post_norm"] if {"eagle3", "dspark"} & set(kinds) else []
    control = [f"capture.kinds=[{','.join(kinds)}]", f"capture.final=[{','.join(ctl_final)}]",
               *(lay(k, off_by_one(default[k])) for k in kinds)]  # fmt: skip
    P.facts["disk"] = plan_capture(ds / "default", kinds, template and not a.no_controls,
                                   a.reference_batch if a.reference_python else None,
                                   a.speculators, a.disk_gb, w, a.overlap,
                                   controls=not a.no_controls)  # fmt: skip
    hsd = _py("-m", "hsdump")
    msgs = ex / "messages" / "conversations.jsonl"
    run("export-messages", [*hsd, "export", ds / "default", ex / "messages", "--to",
                              "messages", "--no-progress"], env=env, done=msgs)  # fmt: skip
    ref = w / "ref"
    rc_py = ROOT / "bench" / "reference_capture.py"

    def export_records(name, src, kind, check=True):
        return run(f"export-{name}", [*hsd, "export", ds / src, ex / name, "--to", "specforge",
                                 "--kind", kind, "--no-progress"], env=env,
              done=ex / name / "hsdump_export.json", check=check)  # fmt: skip

    def capture_layer_off(check=True):
        return run("extract-layer_off",
              _py("extract.py", *common, f"dataset.path={msgs}", "dataset.format=messages",
                  "regenerate=none", *control,
                  *([] if cpu else [f"engine.max_total_tokens={a.capture_kv_tokens}"]),
                  f"output.dir={ds / 'layer_off'}"),
              env=env, done=ds / "layer_off" / "index.json", check=check)  # fmt: skip

    def capture_template(check=True):  # EAGLE-3's wrong-template control: another template
        return run("extract-template",
              _py(*SPECULATORS, "extract-unchecked", *common, f"dataset.path={msgs}",
                  "dataset.format=messages", "regenerate=none", "capture.kinds=[eagle3]",
                  "capture.final=[post_norm]", f"model.chat_template={WRONG_TEMPLATE}",
                  *([] if cpu else [f"engine.max_total_tokens={a.capture_kv_tokens}"]),
                  f"output.dir={ds / 'template'}"),
              env=env, done=ds / "template" / "index.json", check=check)  # fmt: skip

    def reference_ids(check=True):  # the drafter's token ids, before the capture is released
        ref.mkdir(parents=True, exist_ok=True)
        return run("reference-ids", _py(rc_py, "ids", ds / "default", ref / "ids.jsonl"),
              env=env, done=ref / "ids.jsonl", check=check)  # fmt: skip

    def reference_capture(kind, check=True):
        """SpecForge's own offline capture (its SGLang pin, in its own interpreter) of the
        drafter's token ids at the same serving ids (the default export's)"""
        ids = export_facts(ex / f"{kind}-default")["serving_ids"]
        return run("reference-capture",
              _py(rc_py, "specforge", ref / "ids.jsonl", ex / f"{kind}-specforge",
                  "--model", target, "--layers", ",".join(map(str, ids)),
                  "--python", a.reference_python, "--batch", a.reference_batch,
                  "--device", "cpu" if cpu else "cuda",
                  # hsdump's GPU preset's backend (the offline host's bundles drop FA3)
                  *([] if cpu else ["--attention-backend", "triton"])),
              env=env, done=ex / f"{kind}-specforge" / "reference_capture.json",
              check=check)  # fmt: skip

    def reference_first():  # the overlap's: the ids, the default export, SpecForge's capture
        if (
            reference_ids(False) == 0
            and export_records("eagle3-default", "default", "eagle3", False) == 0
        ):
            reference_capture("eagle3", False)

    if a.overlap and not a.no_controls:  # the controls' captures and SpecForge's side by side
        overlap(P, [
            ({"extract-layer_off": (ds / "layer_off" / "index.json", [ds / "layer_off"])},
             lambda: capture_layer_off(False)),
            *([({"extract-template": (ds / "template" / "index.json", [ds / "template"])},
                lambda: capture_template(False))] if template else []),
            *([({"reference-ids": (ref / "ids.jsonl", [ref / "ids.jsonl"]),
                 "export-eagle3-default": (ex / "eagle3-default" / "hsdump_export.json",
                                           [ex / "eagle3-default"]),
                 "reference-capture": (ex / "eagle3-specforge" / "reference_capture.json",
                                       [ex / "eagle3-specforge"])}, reference_first)]
              if "eagle3" in kinds and a.reference_python else []),
        ])  # fmt: skip
    if not a.no_controls:  # what the overlap left undone (all of it without --overlap), alone
        capture_layer_off()
    if template:
        capture_template()
    P.facts.update(env_facts(), datasets=dataset_facts(ds), sizing=dict(
        samples=a.samples, epochs=a.epochs, eval_samples=a.eval_samples,
        train_budget_s=a.train_budget_s, trainers_stop_s=stop_s,
        deadline_s=a.deadline_s, heldout=a.serve_limit or "all",
        serve_new_tokens=a.serve_new_tokens))  # fmt: skip
    P.save()

    def serve_cmd(name, algorithm=None, drafter=None, eager=False, extra=(), out=None, size=None):
        """A served row's command (its JSON in the results, serve-NAME.json, unless `out`);
        `size` (SMOKE_SIZE: the smoke serve's) instead of the run's prompts and KV pool."""
        size = size or dict(new_tokens=a.serve_new_tokens, batch1=a.batch1, limit=a.serve_limit,
                            mem_fraction=a.mem_fraction or SERVE_MEM_FRACTION,
                            kv_tokens=a.serve_kv_tokens, batch_sizes=a.batch_sizes)  # fmt: skip
        cmd = _py(*SPECULATORS, "serve", "--target", target,
                  "--heldout", data / "heldout.jsonl", "--name", name,
                  "--json", out or P.res / f"serve-{name}.json",
                  "--max-new-tokens", size["new_tokens"], "--batch1", size["batch1"],
                  "--mem-fraction", size["mem_fraction"],
                  "--max-total-tokens", size["kv_tokens"],
                  "--device", a.device)  # fmt: skip
        if size["limit"]:
            cmd += ["--limit", str(size["limit"])]
        if size.get("batch_sizes"):
            cmd += ["--batch-sizes", size["batch_sizes"]]
        if drafter:
            cmd += ["--drafter", str(drafter), "--algorithm", algorithm]
        else:  # the plain target: how near a tie each greedy choice was (divergence)
            cmd.append("--margins")
        if eager or (drafter and a.eager_drafters):
            cmd.append("--eager")
        return cmd + list(extra)

    def smoke_serve(kind, cfg):
        """An untrained drafter of the kind (SpecForge's own model and export, from the run's
        draft config), served on 8 held-out prompts by an engine beside the trainers (its KV
        pool capped at 60,000 tokens, about 1.4 GB of SmolLM2's): whether SGLang serves the
        kind on this host, known while the drafters train rather than after; DSpark in
        cap-accept mode too. Its accept length means nothing (results' smoke/)."""
        d = w / "smoke" / kind
        (P.res / "smoke").mkdir(parents=True, exist_ok=True)
        if run(f"smoke-untrained-{kind}",
               _py(*me, "untrained", "--kind", kind, "--draft-config", cfg, "--work", d,
                   "--out", d / "served"),
               env=env, done=d / "served" / "config.json", check=False):  # fmt: skip
            return
        modes = [[]]
        if kind == "dspark" and not a.no_cap_accept:
            modes.append(["--ragged-verify-mode", "cap-accept"])
        for extra in modes:
            name = f"smoke-{kind}" + ("-cap_accept" if extra else "")
            out = P.res / "smoke" / f"{name}.json"
            run(name, serve_cmd(name, ALGORITHM[kind], d / "served", extra=extra, out=out,
                                size=SMOKE_SIZE),
                env=env, done=out, check=False)  # fmt: skip

    def serve_together(items, eager=False, again=False):
        """The engines start together (their start is not timed) and are timed one at a time
        while the others wait idle (the speculators CLI's serve --ready/--go/--release); each row
        goes into the table as soon as it is measured. An engine that could not size its KV
        pool beside the others starting (`kv_pool_race`) starts again, with CUDA graphs, once
        they are gone; the engines start --serve-stagger-s apart so that this is rare (each
        measures its free memory before and after loading its weights, about 30 s after its
        start, and allocates its pool just after: on the H100, 2026-12-06, five engines started
        together passed that point within 5 s of each other, and the third and fourth to pass it
        failed). The drafters whose CUDA graphs fail are served again without them,
        together, beside the plain target without them (`plain_eager`, their speed-ups'
        reference). On the H200, 2026-12-03, SGLang 0.5.23's EAGLE-3 draft graphs failed this
        way (its eagle_worker_v2 imports FlashMLA's backend whatever the attention backend,
        and the host's bundle had no sgl-flash-mla)."""
        gate = w / "gate"
        shutil.rmtree(gate, ignore_errors=True)
        gate.mkdir(parents=True)
        todo = [it for it in items if not (P.res / f"serve-{it[0]}.json").exists()]
        step_of = lambda n, drafter: f"serve-{n}" + ("-eager" if eager and drafter else "")  # noqa: E731
        ts = {}
        for i, (name, algorithm, drafter, *more) in enumerate(todo):
            if i and a.serve_stagger_s > 0:  # one engine's KV pool sized at a time (kv_pool_race)
                time.sleep(a.serve_stagger_s)
            cmd = [*serve_cmd(name, algorithm, drafter, eager, *more), "--ready", gate / f"ready-{name}",
                   "--go", gate / f"go-{name}", "--release", gate / "release"]  # fmt: skip
            if a.serve_turns:  # batch 1 timed in turns with the engines beside it (turns.py)
                cmd += ["--turns", gate, "--turn-prompts", str(a.serve_turns)]
            step = step_of(name, drafter) + ("-again" if again else "")
            ts[name] = run_thread(run, step, cmd, env, None, False)[0]
        for name, t in ts.items():
            while t.is_alive() and not (gate / f"ready-{name}").exists():
                time.sleep(0.5)
        if a.serve_turns and ts:  # every engine up: batch 1 in turns, then the rest one at a time
            order = hand_turns(gate, list(ts), alive=lambda n: ts[n].is_alive())
            print(f"batch 1 in turns: {len(order)} groups of {a.serve_turns} prompts, "
                  f"{len(ts)} engines", flush=True)  # fmt: skip
        for name, t in ts.items():
            (gate / f"go-{name}").write_text("go\n")
            while t.is_alive() and not (P.res / f"serve-{name}.json").exists():
                time.sleep(0.5)
            table(argparse.Namespace(results=str(P.res), json=None))
        (gate / "release").write_text("done\n")
        for t in ts.values():
            t.join()
        missing = [it for it in todo if not (P.res / f"serve-{it[0]}.json").exists()]
        race = [it for it in missing
                if not again and kv_pool_race(P.logs / f"{step_of(it[0], it[2])}.log")]  # fmt: skip
        if race:
            print(f"serving again, alone: {[it[0] for it in race]} (their KV pool could not be "
                  "sized beside the engines starting with them)", flush=True)  # fmt: skip
            gone = {step_of(it[0], it[2]) for it in race}
            with P.lock:
                P.failed[:] = [f for f in P.failed if f not in gone]
            serve_together(race, eager=eager, again=True)
            missing = [it for it in missing if not (P.res / f"serve-{it[0]}.json").exists()]
        failed = [it for it in missing if it[2] and it not in race]  # (the retry fell back itself)
        if failed and not (eager or a.eager_drafters):
            serve_together([("plain_eager", None, None), *failed], eager=True)
        P.save()
        table(argparse.Namespace(results=str(P.res), json=None))

    for i_kind, kind in enumerate(kinds):
        names = {f"{kind}-default": "default"}
        if not a.no_controls:
            names[f"{kind}-layer_off"] = "layer_off"
        if kind == "eagle3" and template:
            names[f"{kind}-template"] = "template"
        if kind == "eagle3" and a.reference_python:
            reference_ids()
        spec = kind == "eagle3" and a.speculators  # speculators' own EAGLE-3 trainer too
        if spec:
            run("export-eagle3-speculators",
                  [*hsd, "export", ds / "default", ex / "eagle3-speculators", "--to",
                   "speculators", "--kind", "eagle3", "--no-progress"], env=env,
                  done=ex / "eagle3-speculators" / "hsdump_export.json")  # fmt: skip
        for name, src in names.items():
            export_records(name, src, kind)
            # a capture no later step reads goes at once (disk_plan counts on it): the
            # template control's after its export, the others after the last kind's (their
            # index and manifest stay: the facts, and a resumed run's markers)
            if checking is not None and src == "default":
                checking.join()
            if spent(src, i_kind, kinds) and not a.keep_exports and (ds / src / "shards").exists():
                print(f"releasing {ds / src}'s shards (no later step reads them)", flush=True)
                shutil.rmtree(ds / src / "shards", ignore_errors=True)
        ids = export_facts(ex / f"{kind}-default")["serving_ids"]
        if kind == "eagle3" and a.reference_python:
            # the table's eagle3-specforge line is hsdump's drafter minus this one, trained,
            # exported and served like the drafter
            reference_capture(kind)
            names[f"{kind}-specforge"] = "specforge"
        cfg = w / "draft" / f"{kind}.json"  # the control is served with the default's ids
        cfg.parent.mkdir(parents=True, exist_ok=True)
        # --fc-norm is EAGLE-3's; draft_config leaves the other kinds' configs as they are
        cfg.write_text(json.dumps(draft_config(kind, target, ids, **drafter_options(a)),
                                  indent=1) + "\n")  # fmt: skip
        plan = training_plan(a, kind, probe(a, kind, P, me, target, ex / f"{kind}-default", cfg,
                                            w / "probe" / kind, env),
                             n_records=len(list((ex / f"{kind}-default").glob("rows_*/data_*.ckpt"))),
                             side_by_side=len(names) + bool(spec))  # fmt: skip
        plan["learning_rate"] = a.learning_rate or TRAINING[kind]["learning_rate"]
        plan["optimizer"] = a.optimizer
        if kind == "eagle3":
            plan.update(head_init=a.head_init, **drafter_options(a),
                        ttt_length=a.ttt_length or TRAINING[kind]["ttt_length"])  # fmt: skip
        P.facts.setdefault("training", {})[kind] = plan
        with P.lock:  # a backend that fails in the probe is a finding, not a failed run
            P.failed[:] = [f for f in P.failed if not f.startswith(f"probe-{kind}-")]
        P.save()
        procs = []
        for name in names:
            cmd = _py(*me, "train", "--kind", kind, "--target", target, "--data", ex / name,
                      "--draft-config", cfg, "--out", w / "train" / name,
                      "--epochs", plan["epochs"], "--eval-samples", a.eval_samples,
                      "--attention-backend", plan["attention_backend"],
                      "--log-copy", P.res / f"sf-train-{name}.log",
                      "--batch-size", a.batch_size, "--max-length", a.max_length,
                      "--num-workers", a.num_workers, "--log-interval", a.log_interval,
                      "--save-interval", a.save_interval,
                      "--keep-checkpoints", a.keep_checkpoints,
                      *(["--max-steps", a.max_steps] if a.max_steps else []),
                      *(["--learning-rate", a.learning_rate] if a.learning_rate else []),
                      *(["--head-init", a.head_init] if kind == "eagle3" else []),
                      *(["--ttt-length", a.ttt_length] if kind == "eagle3" and a.ttt_length
                        else []),  # fmt: skip
                      "--optimizer", a.optimizer,
                      *(["--cpu"] if cpu else []))  # fmt: skip
            if not trained(w / "train" / name):  # a resumed run trains again what failed
                t, box = run_thread(P.run, f"train-{name}", cmd, env, None, False)
                procs.append((name, t))
        spec_ckpt = w / "ckpt" / "eagle3-speculators"
        if spec and not speculators_epochs(spec_ckpt):
            cmd = _py(*SPECULATORS, "train", "--data", ex / "eagle3-speculators",
                      "--target", target, "--save", spec_ckpt, "--epochs", a.epochs,
                      "--num-workers", a.num_workers, "--log-freq", a.log_interval,
                      *(["--max-steps", a.max_steps] if a.max_steps else []),
                      *(["--cpu"] if cpu else []))  # fmt: skip
            procs.append(("eagle3-speculators",
                          run_thread(P.run, "train-eagle3-speculators", cmd, env, None, False)[0]))  # fmt: skip
        smoke = None
        if procs and not cpu and not a.no_smoke_serve:
            smoke = run_thread(smoke_serve, kind, cfg)[0]
        end = train_end(time.time(), a.train_budget_s, started, stop_s)
        while any(t.is_alive() for _, t in procs):
            if time.time() > end:
                print(f"training budget spent: stopping {kind}'s trainings", flush=True)
                for name, _ in procs:
                    P.stop(f"train-{name}")
                break
            time.sleep(2)
        for _, t in procs:
            t.join()
        if smoke is not None:
            smoke.join()
        extra = []  # served beside the kind's SpecForge drafters
        if spec:
            got = speculators_drafter(spec_ckpt, w / "served" / "eagle3-speculators",
                                      default["eagle3"], run, env)  # fmt: skip
            if got:
                (P.res / "train-eagle3-speculators.json").write_text(
                    json.dumps(got, indent=1) + "\n"
                )
                extra.append(("eagle3-speculators", "EAGLE3", w / "served" / "eagle3-speculators"))
            else:
                P.failed.append("eagle3-speculators: no epoch checkpoint to serve")
        # drafter and controls are served from the same step (the newest all reached), but a
        # trainer that failed (after its resumes) does not cut the others' training short: it
        # is served at its newest checkpoint up to theirs, and its pair says not the same step
        steps = {n: dict((s, p) for s, p in checkpoints(w / "train" / n / "run")) for n in names}
        ok = [n for n in names if trained(w / "train" / n)] or list(names)
        served_at = served_steps(steps, ok)
        if all(served_at[n] is None for n in ok):
            P.failed.append(f"{kind}: no checkpoint common to {ok}")
            names = {}
        for n in [n for n in names if served_at[n] is None]:
            P.failed.append(f"{kind}: {n} has no checkpoint to serve")
            names.pop(n)
        P.save()

        def finish(name, kind=kind, steps=steps, cfg=cfg, served_at=served_at):
            """SpecForge's export of the served step, DFlash's prediction, the facts."""
            step = served_at[name]
            rows = trainer_metrics(w / "train" / name / "train.log")
            facts = dict(kind=kind, steps=rows[-1]["step"] if rows else 0, served_step=step,
                         **predicted_accept_length(kind, rows, upto=step))  # fmt: skip
            tj = w / "train" / name / "train.json"
            t = json.loads(tj.read_text()) if tj.exists() else {}
            facts.update(eval_curve=eval_curve(rows), step_time=step_time(rows),
                         attention_backend=(t.get("config") or {}).get("training", {}).get(
                             "attention_backend"),
                         epochs=(t.get("config") or {}).get("training", {}).get("num_epochs"),
                         train_records=t.get("samples"), stopped_by_budget=t.get("stopped_by_budget"))  # fmt: skip
            served = sf_export(name, kind, steps[name][step], cfg)
            pj = P.res / f"predict-{name}.json"
            if kind in ("dflash", "dspark") and (served / "config.json").exists():
                run(f"predict-{name}",
                      _py(*me, "predict", "--kind", kind, "--train", w / "train" / name,
                          "--drafter", served, "--json", pj, *(["--cpu"] if cpu else []),
                          "--answer-tokens", a.serve_new_tokens),
                      env=env, done=pj, check=False)  # fmt: skip
            if pj.exists():
                x = json.loads(pj.read_text())
                facts.update(trainer_predicted=facts.get("predicted"),
                             trainer_source=facts.get("source"), predicted=x["predicted"],
                             source=x["source"], per_position_acc=x["per_position_acc"],
                             tau_probabilistic_heldout=x.get("tau_probabilistic"))  # fmt: skip
            (P.res / f"train-{name}.json").write_text(json.dumps(facts, indent=1) + "\n")
            if a.control_own_layers and name == f"{kind}-layer_off":
                own_layers(name, kind, steps[name][step], facts)

        def sf_export(name, kind, ckpt, cfg) -> Path:
            """SpecForge's export of a checkpoint with draft config `cfg`: served/NAME."""
            served = w / "served" / name
            run(f"sf-export-{name}",
                  _py(*me, "export", "--kind", kind, "--ckpt", ckpt, "--draft-config", cfg,
                      "--out", served, "--target", target),
                  env=env, done=served / "config.json", check=False)  # fmt: skip
            return served

        def own_layers(name, kind, ckpt, facts):
            """The control's step exported again by SpecForge with a draft config on its own
            export's serving ids (the layers it trained on; the row above reads the
            drafter's): served as NAME_own, its facts the control's."""
            c = w / "draft" / f"{name}_own.json"
            ids = write_draft_config(kind, target, ex / name, c, **drafter_options(a))
            sf_export(f"{name}_own", kind, ckpt, c)
            (P.res / f"train-{name}_own.json").write_text(
                json.dumps(dict(facts, serving_ids=ids), indent=1) + "\n")  # fmt: skip

        # side by side: each is mostly its interpreter's imports (21-25 s on the H200 host)
        for t, _ in [run_thread(finish, n) for n in names]:
            t.join()
        names = {n: v for n, v in names.items() if (w / "served" / n / "config.json").exists()}
        own = w / "served" / f"{kind}-layer_off_own"
        if a.control_own_layers and (own / "config.json").exists():
            extra.append((own.name, ALGORITHM[kind], own))
        if kind == "dspark" and f"{kind}-default" in names and not a.no_cap_accept:
            # its confidence head at work: SGLang builds it in cap-accept mode only, where it
            # caps each request's accepted drafts (the static rows verify every draft)
            extra.append((f"{kind}-default-cap_accept", ALGORITHM[kind],
                          w / "served" / f"{kind}-default", ["--ragged-verify-mode", "cap-accept"]))  # fmt: skip
        if not cpu:  # the plain target (every row's reference) with the first kind
            items = [("plain", None, None)] + [
                (n, ALGORITHM[kind], w / "served" / n) for n in names] + extra  # fmt: skip
            if kind == "eagle3" and a.serve_settings:  # the drafter at each (steps, topk, tokens)
                d = f"{kind}-default"
                items = [("plain", None, None)] + [
                    setting_item(d, x, w / "served" / d)
                    for x in a.serve_settings.split(";") if d in names]  # fmt: skip
            n = a.engines_at_once
            for i in range(0, len(items), n):  # --mem-fraction each
                serve_together(items[i : i + n])
        if not a.keep_exports:  # disk: the drafters are trained, their records can go
            for name in names:  # (hsdump_export.json stays: the ids, and a resumed run's marker)
                for rows in (ex / name).glob("rows_*"):
                    shutil.rmtree(rows, ignore_errors=True)
            if spec and extra:  # speculators' records: its hidden_states/ folder
                shutil.rmtree(ex / "eagle3-speculators" / "hidden_states", ignore_errors=True)
    P.save()
    table(argparse.Namespace(results=str(P.res), json=None))
    if a.serve_settings and not cpu and (P.res / "serve-plain.json").exists():
        # where the drafter's greedy outputs leave plain's: the target's margin there; then
        # the speed table (speed-up, break-even accept length, agreement)
        rows = sorted(P.res.glob("serve-eagle3-default-s*.json"))
        run("margins", _py(*me, "margins", "--target", target, "--heldout",
                           data / "heldout.jsonl", "--plain", P.res / "serve-plain.json",
                           "--out", P.res / "margins.json", *rows),
            env=env, done=P.res / "margins.json", check=False)  # fmt: skip
        run("speedup", _py(*me, "speedup", "--results", P.res, "--target", a.target or target,
                           "--json", P.res / "speedup.json"), env=env, check=False)  # fmt: skip
    if P.failed:  # the table holds what did run; the exit says that something did not
        print(f"failed steps: {P.failed} (pipeline.json)", flush=True)
    return 1 if P.failed else 0


def speculators_drafter(ckpt: Path, served: Path, layers, run, env) -> dict:
    """speculators' newest epoch, converted to SGLang's LlamaForCausalLMEagle3 layout
    (`python3 -m bench.acceptance.speculators convert`, with hsdump's layers), and its own
    prediction: 1 + the sum over the 3 served steps of its validation `full_acc` (cumulative:
    the chance that the first k drafts are all right). {} when no epoch was saved."""
    epochs = speculators_epochs(ckpt)
    if not epochs:
        return {}
    e = epochs[-1]
    run("convert-eagle3-speculators",
        _py(*SPECULATORS, "convert", "--ckpt", ckpt / str(e), "--out", served,
            "--aux-layers", ",".join(map(str, layers))),
        env=env, done=served / "config.json")  # fmt: skip
    vm = ckpt / str(e) / "val_metrics.json"
    m = json.loads(vm.read_text()) if vm.exists() else {}
    acc_k = [m.get(f"full_acc_{k}_epoch") for k in range(SERVED_STEPS)]
    ok = all(x is not None for x in acc_k)
    return dict(kind="eagle3", trainer="speculators 0.9.0", epochs=epochs, served_epoch=e,
                steps=None, served_step=f"epoch {e}", eval=m,
                predicted=round(1 + sum(acc_k), 4) if ok else None,
                source="1 + speculators' val full_acc, 3 steps" if ok else None)  # fmt: skip


def probe(a, kind, P, me, target, records, cfg, dest: Path, env) -> dict:
    """Where SpecForge's step time goes on this machine, before the kind trains: its trainer
    alone on the drafter's records for --probe-steps steps with each attention backend
    (sdpa: DFlash's block mask dense; flex_attention: SpecForge's default, compiled), batch and
    workers as the run's; its own per-step timing (perf/ lines: data wait and compute) and its
    own profiler over 4 steps near the end, summarised by kernel (trace_summary). Each run is
    stopped after --probe-timeout-s (a compile that hangs costs no more). Results in the
    results' probe-KIND.json; {} when no probe runs (--probe-steps 0, the CPU's default)."""
    res = P.res
    n = a.probe_steps if a.probe_steps is not None else (0 if a.device == "cpu" else 40)
    if not n:
        return {}
    out = res / f"probe-{kind}.json"
    if out.exists():
        return json.loads(out.read_text())
    got = {}
    for backend in ("sdpa", "flex_attention"):
        d = dest / backend
        cmd = _py(*me, "train", "--kind", kind, "--target", target, "--data", records,
                  "--draft-config", cfg, "--out", d, "--epochs", 1, "--max-steps", n,
                  "--eval-samples", 0, "--batch-size", a.batch_size, "--max-length", a.max_length,
                  "--num-workers", a.num_workers, "--log-interval", max(1, n // 8),
                  "--save-interval", n, "--attention-backend", backend,
                  "--profile-at", max(1, n - 6), "--log-copy", res / f"probe-{kind}-{backend}.log",
                  *(["--cpu"] if a.device == "cpu" else []))  # fmt: skip
        name = f"probe-{kind}-{backend}"
        t, _ = run_thread(P.run, name, [str(c) for c in cmd], env, None, False)
        t.join(a.probe_timeout_s)
        if t.is_alive():
            print(f"probe {backend}: stopped after {a.probe_timeout_s:.0f} s", flush=True)
            P.stop(name)
            t.join()
        rc = next((s["rc"] for s in reversed(P.steps) if s["name"] == name), None)
        t = json.loads((d / "train.json").read_text()) if (d / "train.json").exists() else {}
        traces = sorted((d / "run").glob("**/*.trace.json*"))
        got[backend] = dict(rc=rc, steps=t.get("steps"), step_time=t.get("step_time") or {},
                            profile=trace_summary(traces[-1]) if traces else None)  # fmt: skip
        shutil.rmtree(d / "run", ignore_errors=True)  # its checkpoint and trace: disk
    ok = {b: g["step_time"]["step_s"] for b, g in got.items()
          if g["rc"] == 0 and g["step_time"].get("step_s")}  # fmt: skip
    r = dict(steps=n, batch_size=a.batch_size, num_workers=a.num_workers, backends=got,
             faster=min(ok, key=ok.get) if ok else None)  # fmt: skip
    out.write_text(json.dumps(r, indent=1) + "\n")
    return r
