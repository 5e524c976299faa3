"""DFlash's and DSpark's accept length as SpecForge's own code predicts it for the served
drafter (`python3 -m bench.acceptance predict`)."""

from __future__ import annotations

import json
import time
from pathlib import Path


def first_answer_tokens(loss_mask, n: int):
    """`loss_mask` ([1, T]) with each run of supervised tokens (an answer) cut to its first
    `n`: the span a serving of `n` new tokens drafts over. A greedy small target falls into
    loops as its answer grows (bench/repetition.py), which a drafter drafts easily, so the
    later tokens of long answers weigh the count toward what the serving never reaches."""
    import torch

    pos = torch.arange(loss_mask.shape[-1])
    # each position's index within its run: its own less the last unsupervised one's before it
    last_off = torch.where(loss_mask.bool(), -1, pos).cummax(dim=-1).values
    return torch.where(pos - last_off > n, torch.zeros_like(loss_mask), loss_mask)


def predict(a) -> int:
    """DFlash's and DSpark's accept length as their trainer's own code predicts it, for the
    served drafter, greedy: SpecForge 0.2.0's DFlash strategy logs token accuracy only, and its
    DSpark eval no accept length, but its DFlash family has `compute_accept_len` (what its
    Domino model reports: per block, 1 + the drafted prefix equal to the target's tokens).
    This loads the folder SpecForge exported (`AutoDraftModel.from_pretrained`) into
    SpecForge's `OnlineDFlashModel` / `OnlineDSparkModel`, built as its trainer builds them
    from the run's run.json (the target's embedding and LM head through its
    `TargetEmbeddingsAndHead`, the drafter's mask token and block, the run's anchors, loss
    decay, loss weights and attention backend), runs it over the trainer's held-out records
    (read by its normalizer), and counts every block of the model's own forward with
    `compute_accept_len` on the argmax of its logits (DSpark's after its Markov head, fed the
    target's previous tokens, which are the drafted ones along an accepted prefix).
    Teacher-forced, as EAGLE-3's prediction from its per-position accuracies is. DSpark's own
    `tau_probabilistic` over the same records is kept beside it."""
    import torch
    from specforge.algorithms.common import dflash_family_data as fd
    from specforge.algorithms.common import dflash_family_model as fm
    from specforge.modeling.auto import AutoDraftModel
    from specforge.modeling.target.target_utils import TargetEmbeddingsAndHead

    if a.kind not in ("dflash", "dspark"):
        raise SystemExit("predict: DFlash and DSpark (EAGLE-3's trainer logs its own)")
    dspark = a.kind == "dspark"
    run = json.loads((Path(a.train) / "run.json").read_text())
    m_cfg, tr, data = run["model"], run["training"], run["data"]
    records = sorted(Path(a.records or data["eval_hidden_states_path"]).glob("*.ckpt"),
                     key=lambda f: int(f.stem.split("_")[1]))[: a.limit]  # fmt: skip
    if not records:
        raise SystemExit(f"predict: no records in {a.records or data['eval_hidden_states_path']}")
    device = torch.device("cpu" if a.cpu or not torch.cuda.is_available() else "cuda")
    dtype = getattr(torch, m_cfg.get("torch_dtype", "bfloat16"))  # as the trainer ran it
    torch.manual_seed(0)
    draft = AutoDraftModel.from_pretrained(a.drafter, torch_dtype=dtype,
                                           attn_implementation=tr["attention_backend"])  # fmt: skip
    dcfg = draft.config.to_dict()
    mask = (dcfg.get("dflash_config") or {}).get("mask_token_id")
    if mask is None:
        raise SystemExit(f"{a.drafter}: no dflash_config.mask_token_id")
    head = TargetEmbeddingsAndHead.from_pretrained(
        m_cfg["target_model_path"], embed_key=m_cfg.get("embedding_key"),
        lm_head_key=m_cfg.get("lm_head_key"), device=device.type, dtype=dtype,
    )  # fmt: skip
    common = dict(
        draft_model=draft, target_lm_head=head.lm_head, target_embed_tokens=head.embed_tokens,
        mask_token_id=int(mask), block_size=int(draft.block_size),
        attention_backend=tr["attention_backend"], num_anchors=int(tr["num_anchors"]),
        loss_decay_gamma=tr.get("loss_decay_gamma"),
    )  # fmt: skip
    if dspark:
        weights = {k: tr[k] for k in ("dspark_ce_loss_alpha", "dspark_l1_loss_alpha",
                                      "dspark_confidence_head_alpha") if k in tr}  # fmt: skip
        model = fm.OnlineDSparkModel(**common, **weights)
    else:
        model = fm.OnlineDFlashModel(**common)
    model = model.to(device=device, dtype=dtype).eval()
    B = int(draft.block_size)
    sums = dict(accept=0.0, blocks=0.0, correct=torch.zeros(B, dtype=torch.float64),
                valid=torch.zeros(B, dtype=torch.float64), tau=[0.0, 0.0],
                hist=torch.zeros(B + 2, dtype=torch.float64))  # fmt: skip

    def count(pred, target_ids, valid):
        accepted = fm.compute_accept_len(pred, target_ids, valid)  # SpecForge's own count
        blocks = valid.any(dim=-1)
        sums["accept"] += float(((accepted + 1.0) * blocks).sum())
        sums["blocks"] += float(blocks.sum())
        sums["correct"] += ((pred == target_ids) & valid).sum(dim=(0, 1)).double().cpu()
        sums["valid"] += valid.sum(dim=(0, 1)).double().cpu()
        sums["hist"] += torch.bincount((accepted + 1.0)[blocks].long().cpu(),
                                       minlength=B + 2)[: B + 2].double()  # fmt: skip

    def logits(hidden):
        b, n, k, h = hidden.shape
        return model.lm_head(hidden.reshape(b, n * k, h)).reshape(b, n, k, -1)

    if dspark:  # the model's blocks, as its loss sees them (wrapped, then run as they are)
        terms = model._dspark_objective_chunk_terms

        def counted(hidden, prev_ids, target_ids, loss_weights, eval_mask, aligned):
            draft_logits = model.draft_model.apply_logits_head(
                logits(hidden), prev_token_ids=prev_ids, hidden_states=hidden
            )
            count(draft_logits.argmax(-1), target_ids, eval_mask > 0)
            return terms(hidden, prev_ids, target_ids, loss_weights, eval_mask, aligned)

        model._dspark_objective_chunk_terms = counted
        normalize = fd.normalize_dspark_offline_sample
    else:
        terms = model._dflash_objective_chunk_terms

        def counted(hidden, target_ids, weight_mask):
            count(logits(hidden).argmax(-1), target_ids, weight_mask > 0)
            return terms(hidden, target_ids, weight_mask)

        model._dflash_objective_chunk_terms = counted
        normalize = fd.normalize_offline_sample
    t0 = time.time()
    with torch.no_grad():
        for f in records:
            raw = torch.load(f, map_location="cpu", weights_only=True)
            x = normalize(raw, max_len=int(data["max_length"]))
            if a.answer_tokens:
                x["loss_mask"] = first_answer_tokens(x["loss_mask"], a.answer_tokens)
                if not x["loss_mask"].any():
                    continue
            kw = dict(input_ids=x["input_ids"].to(device),
                      hidden_states=x["hidden_states"].to(device=device, dtype=dtype),
                      loss_mask=x["loss_mask"].to(device))  # fmt: skip
            if dspark:
                kw["target_last_hidden_states"] = x["target_last_hidden_states"].to(
                    device=device, dtype=dtype
                )
            _, _, metrics = model(**kw)
            tau = (metrics.get("ratio_metrics") or {}).get("tau_probabilistic")
            if tau is not None:
                sums["tau"][0] += float(tau[0])
                sums["tau"][1] += float(tau[1])
    if not sums["blocks"]:
        raise SystemExit("predict: no block with a supervised token in the records")
    v = sums["valid"]
    res = dict(
        kind=a.kind, drafter=str(a.drafter), records=len(records), blocks=int(sums["blocks"]),
        predicted=round(sums["accept"] / sums["blocks"], 4),
        # SpecForge's eval/avg_acc at the same step, recounted: the drafter runs as trained
        accuracy=round(float(sums["correct"].sum() / v.sum()), 4),
        source=f"SpecForge compute_accept_len over {type(model).__name__}'s blocks, "
        "held-out records, greedy"
        + (f", each answer's first {a.answer_tokens} tokens" if a.answer_tokens else ""),
        answer_tokens=a.answer_tokens or None,
        per_position_acc=[round(float(c / x), 4) if x else None
                          for c, x in zip(sums["correct"], v)],
        accept_histogram=[int(x) for x in sums["hist"]][1:],
        tau_probabilistic=round(sums["tau"][0] / sums["tau"][1], 4) if sums["tau"][1] else None,
        block_size=B, num_anchors=int(tr["num_anchors"]), device=device.type,
        seconds=round(time.time() - t0, 1),
    )  # fmt: skip
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
    keys = ("kind", "records", "blocks", "predicted", "accuracy", "tau_probabilistic")
    print(json.dumps({k: res[k] for k in keys}))
    return 0
