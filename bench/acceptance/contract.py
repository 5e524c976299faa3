"""The config and weight-name contract between SpecForge's export and SGLang's drafter classes,
untrained, on the CPU (`python3 -m bench.acceptance contract|check-served|untrained`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from .drafter import DRAFTER_FLAGS, DSPARK_HEAD, EXPORT_TO, draft_config
from .patches import draft_options
from .pipeline import package_env
from .pipeline import python_cmd as _py


def sglang_load(target: str, folders, env=None) -> dict:
    """Each folder loaded into SGLang's own drafter class for its architecture, on the CPU, in
    one process (SGLang's registry, the class's __init__ from the folder's config, its
    load_weights with every parameter's loader call recorded): folder -> what was found, or
    `error` (what SGLang raised). `env`: variables set for that process."""
    p = subprocess.run(_py("-m", "bench.acceptance.sglang_check", target, *folders),
                       capture_output=True, text=True,
                       env=package_env(dict(os.environ, **(env or {}))))  # fmt: skip
    found = {}
    for line in p.stdout.splitlines():
        if line.startswith("CHECK "):
            r = json.loads(line[len("CHECK ") :])
            found[r.pop("folder")] = r
    if set(found) != set(map(str, folders)):
        raise SystemExit(f"SGLang's loader did not report on every folder:\n{p.stderr[-3000:]}")
    return found


def served_gaps(r: dict, kind: str, ids) -> list:
    """What keeps SGLang from serving the drafter the way it was trained: an error, a
    parameter no tensor of the folder filled (SGLang skips names it does not know and keeps
    their parameters as initialised, silently), layer ids other than the serving ids, no
    mask token (SGLang would add one to the tokenizer)."""
    if "error" in r:
        return [r["error"]]
    # EAGLE-3 drafts share the target's embedding (SpecForge drops it on export; SGLang's
    # worker gives the draft the target's)
    shared = {"model.embed_tokens.weight", "embed_tokens.weight"} if kind == "eagle3" else set()
    gaps = [f"{k} not loaded" for k in r["params"] if k not in r["loaded"] and k not in shared]
    got = r.get("aux_ids") if kind == "eagle3" else r.get("target_layer_ids")
    if [int(x) for x in got or []] != [int(x) for x in ids]:
        gaps.append(f"SGLang reads layer ids {got}, the serving ids are {list(ids)}")
    if kind != "eagle3" and r.get("mask_token_id") is None:
        gaps.append("no dflash_config.mask_token_id")
    return gaps


def untrained_export(kind: str, cfg_path, work, served) -> None:
    """SpecForge's own draft model built from the drafter's config, untrained, saved as its
    trainer saves a checkpoint (`training_state.pt`, embeddings left out) in `work`, and
    exported by SpecForge's own export to `served`."""
    import torch
    from specforge.export.to_hf import export_to_hf
    from specforge.export.to_sglang import export_to_sglang
    from specforge.modeling.auto import AutoDraftModel, AutoDraftModelConfig

    draft_options.apply()
    model = AutoDraftModel.from_config(
        AutoDraftModelConfig.from_file(str(cfg_path)), torch_dtype=torch.bfloat16
    )
    state = {k: v for k, v in model.state_dict().items() if "embed" not in k.lower()}
    Path(work).mkdir(parents=True, exist_ok=True)
    ckpt = Path(work) / "training_state.pt"
    torch.save(dict(strategy=kind, draft_state_dict=state), ckpt)
    (export_to_sglang if EXPORT_TO[kind] == "sglang" else export_to_hf)(
        str(ckpt), str(cfg_path), str(served)
    )


def contract(a) -> int:
    """The config and weight-name contract, untrained, for every kind on the CPU: the drafter's
    config (`draft_config`, with the serving ids hsdump records for the target's class),
    SpecForge's own draft model built from it, its weights as a SpecForge checkpoint
    (`training_state.pt`: the trainer's layout, embeddings left out as its checkpoints leave
    them) and SpecForge's own export of that, then SGLang's class for the folder's
    architecture loading it (`sglang_load`). Also a DSpark folder whose Markov and confidence
    fields sit only under dflash_config, as SpecForge's recipe writes them: SGLang 0.5.23 and
    0.5.17 must refuse it (why `draft_config` writes them at the top level too). Runs under
    either release's wheel (bench/results/contract-0517-cpu.json: 0.5.17's classes)."""
    import importlib.metadata as md

    from hsdump.capture.kinds import KINDS as HSDUMP_KINDS
    from hsdump.capture.kinds import record
    from hsdump.tiny import resolve_model_path

    target = a.target if Path(a.target).is_dir() else resolve_model_path(a.target)
    t = json.loads((Path(target) / "config.json").read_text())
    L, arch = int(t["num_hidden_layers"]), t["architectures"][0]
    out = Path(a.out)
    want, result = {}, {}
    for kind in a.kinds.split(","):
        ids = record({kind: HSDUMP_KINDS[kind].default_layers(L)}, arch, md.version("sglang"))
        ids = ids[kind]["serving_ids"]
        d = out / kind
        d.mkdir(parents=True, exist_ok=True)
        cfg_path = d / "draft.json"
        cfg_path.write_text(json.dumps(draft_config(kind, target, ids), indent=1) + "\n")
        served = str(d / "served")
        untrained_export(kind, cfg_path, d, served)
        want[served] = (kind, ids)
        if kind == "dspark":  # the recipe's layout: the head's fields under dflash_config only
            nested = d / "nested"
            nested.mkdir(exist_ok=True)
            c = json.loads((d / "served" / "config.json").read_text())
            for k in DSPARK_HEAD:
                c.pop(k, None)
            (nested / "config.json").write_text(json.dumps(c, indent=1) + "\n")
            shutil.copy(d / "served" / "model.safetensors", nested / "model.safetensors")
            want[str(nested)] = ("dspark-nested", ids)
        # EAGLE-3's drafter options: an RMSNorm per captured layer before fc (--fc-norm);
        # speculators' drafter, one norm over the concatenation and the normed state fed on
        options = ({"fc_norm"}, {"norm_before_fc", "feed_post_norm"}) if kind == "eagle3" else ()
        for opts in options:
            name = "-".join([kind, *sorted(opts, key=list(DRAFTER_FLAGS).index)])
            f = out / name
            f.mkdir(parents=True, exist_ok=True)
            c = draft_config(kind, target, ids, **dict.fromkeys(opts, True))
            (f / "draft.json").write_text(json.dumps(c, indent=1) + "\n")
            untrained_export(kind, f / "draft.json", f, str(f / "served"))
            want[str(f / "served")] = (name, ids)
    found = sglang_load(target, list(want))
    ok = True
    for folder, (kind, ids) in want.items():
        r = found[folder]
        if kind == "dspark-nested":
            refused = "error" in r and "markov_rank" in r["error"]
            result[kind] = dict(refused_by_sglang=refused, error=r.get("error"))
            ok &= refused
            continue
        gaps = served_gaps(r, kind.split("-")[0], ids)
        result[kind] = dict(
            cls=r.get("cls"), serving_ids=ids, gaps=gaps, tensors=len(r.get("tensors", [])),
            params=len(r.get("params", [])), loaded=len(r.get("loaded", [])),
            **{k: r[k] for k in ("mask_token_id", "block_size", "target_layer_ids", "aux_ids",
                                 "norm_before_fc", "norm_output") if k in r},
        )  # fmt: skip
        ok &= not gaps
    for folder, (kind, ids) in want.items():
        if kind != "dspark":
            continue
        # SGLang builds DSpark's confidence head only in a ragged-verify mode (the default,
        # static, verifies every draft and skips the head's tensors): loaded again in
        # cap-accept, where the head schedules each request's verify length
        r = sglang_load(target, [folder], env={"SGLANG_RAGGED_VERIFY_MODE": "cap-accept"})[folder]
        gaps = served_gaps(r, kind, ids)
        head = [k for k in r.get("params", []) if k.startswith("confidence_head.")]
        if not head:
            gaps.append("no confidence_head parameters in cap-accept mode")
        result["dspark-cap-accept"] = dict(
            cls=r.get("cls"), gaps=gaps, params=len(r.get("params", [])),
            loaded=len(r.get("loaded", [])), confidence_head=sorted(head),
        )  # fmt: skip
        ok &= not gaps
    print(json.dumps(result, indent=1))
    return 0 if ok else 1
