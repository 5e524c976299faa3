"""hsdump's capture speed beside SpecForge 0.2.0's own offline capture (bench/speed_pair.py,
issue 54): what bench/bench.py and bench/reference_capture.py speed record of their runs
(`host_identity`, `ids_digest`) and the pair made of their reports (`pair`), refused where the
two did not time the same thing."""

from __future__ import annotations

import hashlib
import json
import os
import socket
from pathlib import Path

SESSION_ENV = "HSDUMP_SPEED_SESSION"


class NotAPair(ValueError):
    """The two reports are not of the same work, or one is incomplete: what differs."""


def host_identity() -> dict:
    """Which host and which boot of it a run was on, and the session token of its call."""
    boot = None
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        pass
    return {"hostname": socket.gethostname(), "boot_id": boot,
            "session": os.environ.get(SESSION_ENV) or None}  # fmt: skip


def ids_digest(rows) -> str:
    """sha256 of the prompt ids, row by row (the same lists give the same digest)."""
    h = hashlib.sha256()
    for r in rows:
        h.update(json.dumps([int(x) for x in r], separators=(",", ":")).encode())
        h.update(b"\n")
    return h.hexdigest()


def hsdump_side(rep: dict) -> dict:
    runs = rep.get("runs") or {}
    if len(runs) != 1:
        raise NotAPair(f"--hsdump: one model and length expected, found {sorted(runs)}")
    (key, run), = runs.items()  # fmt: skip
    b = (run.get("b") or {}).get("b") or {}
    if "tokens_per_s" not in b:
        raise NotAPair(f"--hsdump: {key} has no mode b result (hsdump to disk): "
                         f"{(run.get('b') or {}).get('error') or 'not run'}")  # fmt: skip
    eng = rep.get("engine_config") or {}
    return {
        "tokens_per_s": round(b["tokens_per_s"], 1),
        "samples": run["samples"],
        "tokens": b["tokens"],
        "seq": run["seq"],
        "wall_s": round(b["wall_s"], 3),
        "plain_prefill_tokens_per_s": round((run.get("a") or {}).get("tokens_per_s") or 0, 1)
        or None,
        "layers_hf_index": run.get("layers"),
        "final": run.get("final") or [],
        "hidden_size": run.get("hidden_size"),
        "bytes_per_token": round(b["bytes_per_token"], 1) if b.get("bytes_per_token") else None,
        "attention_backend": eng.get("attention_backend"),
        "cuda_graph": not eng.get("disable_cuda_graph", False),
        "durability": "fsync (every shard, before the clock stops)",
        "ids_sha256": run.get("ids_sha256"),
        "model": run.get("model"),
        "weights": run.get("weights"),
        "versions": {
            k: (rep.get("env") or {}).get(k)
            for k in ("sglang", "sglang-kernel", "torch", "transformers")
        },  # fmt: skip
        "host": (rep.get("env") or {}).get("host"),
        "gpu": (rep.get("env") or {}).get("gpu"),
        "date": (rep.get("env") or {}).get("date"),
    }


def specforge_side(rep: dict) -> dict:
    t = rep.get("timing") or {}
    if not t.get("tokens_per_s_steady"):
        raise NotAPair("--specforge: no steady rate (one batch only? run more samples than "
                         "its --batch)")  # fmt: skip
    steady = (t.get("batches") or [])[1:]  # the batches its steady rate is over
    fwd = sum(b.get("seconds_capture") or 0 for b in steady)
    return {
        "tokens_per_s": round(t["tokens_per_s_steady"], 1),
        "tokens_per_s_whole_run": round(t["tokens_per_s_whole_run"], 1),
        # its forward alone over the same batches (records and files left out)
        "tokens_per_s_forward_only": round(sum(b["tokens"] for b in steady) / fwd, 1)
        if fwd
        else None,
        "bytes_per_token": round(t["bytes"] / t["tokens"], 1) if t.get("bytes") else None,
        "samples": t["samples"],
        "tokens": t["tokens"],
        "batch": t.get("batch"),
        "seconds_load": round(t.get("seconds_load") or 0, 1),
        "bytes": t.get("bytes"),
        "files": t.get("files"),
        "layers_hf_index": rep.get("hf_hidden_states_index"),
        "layers_sglang_ids": rep.get("sglang_layer_ids"),
        "attention_backend": (rep.get("server_args") or {}).get("attention_backend"),
        "cuda_graph": False,  # load_offline_capture builds its ModelRunner without graphs
        "durability": "fsync (every record and its folder, inside its batch)"
        if t.get("fsync")
        else "none (torch.save, as SpecForge writes)",
        "ids_sha256": rep.get("ids_sha256"),
        "model": rep.get("shape"),
        "versions": rep.get("versions"),
        "host": rep.get("host"),
        "gpu": rep.get("gpu"),
    }


def states_per_token(bytes_per_token, hidden_size):
    """How many bf16 vectors of the model's width a token's record holds (its ids and mask, a
    few bytes, left out)."""
    if not bytes_per_token or not hidden_size:
        return None
    return int(bytes_per_token // (2 * hidden_size))


def pair(hs: dict, sf: dict, allow_unequal_data: bool = False) -> dict:
    """The one results file; NotAPair naming what differs where the two are not a pair. Both
    must write the same states a token (SpecForge's EAGLE-3 records hold the layers and the
    final state: bench.py --final post_norm on hsdump's side), unless `allow_unequal_data`
    (then the file says they differ, and the rate per byte is kept beside the ratio)."""
    differ = []
    for k, what in (("ids_sha256", "prompt ids"), ("samples", "sample count"),
                    ("tokens", "token count"), ("attention_backend", "attention backend"),
                    ("layers_hf_index", "captured layers")):  # fmt: skip
        if hs.get(k) is None or hs.get(k) != sf.get(k):
            differ.append(f"{what}: hsdump {hs.get(k)!r}, SpecForge {sf.get(k)!r}")
    if not sf["durability"].startswith("fsync"):
        differ.append("durability: hsdump fsyncs, SpecForge's run did not (speed --fsync)")
    hn = states_per_token(hs.get("bytes_per_token"), hs.get("hidden_size"))
    sn = states_per_token(sf.get("bytes_per_token"), hs.get("hidden_size"))
    same_data = hn is not None and hn == sn
    if not same_data and not allow_unequal_data:
        differ.append(f"data: hsdump writes {hn} states a token ({hs.get('bytes_per_token')} "
                      f"bytes), SpecForge {sn} ({sf.get('bytes_per_token')} bytes): capture "
                      "the final state too (bench.py --final post_norm)")  # fmt: skip
    if differ:
        raise NotAPair("not a pair: " + "; ".join(differ))
    per_byte = None
    if hs.get("bytes_per_token") and sf.get("bytes_per_token"):  # bytes a second, one to the other
        hb, sb = (
            hs["tokens_per_s"] * hs["bytes_per_token"],
            sf["tokens_per_s"] * sf["bytes_per_token"],
        )
        per_byte = round(hb / sb, 3)
    ha, sa = hs.get("host") or {}, sf.get("host") or {}
    same = bool(ha.get("boot_id") and ha.get("session")
                and (ha.get("hostname"), ha.get("boot_id"), ha.get("session"))
                == (sa.get("hostname"), sa.get("boot_id"), sa.get("session")))  # fmt: skip
    return {
        "what": "hsdump's capture and SpecForge 0.2.0's own offline capture of the same prompt "
        "ids on the same model, each to files on disk (fsynced), timed in one host session",
        "hsdump": hs,
        "specforge": sf,
        "same_host_session": same,
        "ratio": round(hs["tokens_per_s"] / sf["tokens_per_s"], 3),
        "states_per_token": {"hsdump": hn, "specforge": sn},
        "same_data": same_data,
        "ratio_per_byte": per_byte,
        "gpu": hs.get("gpu"),
    }
