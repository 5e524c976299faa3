"""hsdump's capture beside SpecForge 0.2.0's own offline capture, timed in one host session:
one results file from the two runs' own JSON.

    python bench/speed_pair.py --hsdump gpu-llama8b-pair.json \
        --specforge specforge-speed-llama8b.json --out speed-pair.json

`--hsdump` is `bench/bench.py`'s report (mode b: the engine with the capture patch, every row
written to safetensors shards and fsynced before the clock stops); `--specforge` is
`bench/reference_capture.py speed --fsync`'s (SpecForge's `load_offline_capture` and its
record layout, each record `torch.save`d and fsynced inside its batch). Both runs call
`hsdump.testing.speed.host_identity()` and record their prompt ids' digest (`ids_digest`): the pair is written
only when the two ran on the same prompts, the same number of them, the same attention
backend and the same durability; `same_host_session` is true when both name the same boot of
the same host and the same `HSDUMP_SPEED_SESSION` token (run-0523.sh `speedpair` sets one per
call). Anything else is refused with what differs.

The file: `{"hsdump": {"tokens_per_s", ...}, "specforge": {"tokens_per_s", ...},
"same_host_session": true, "ratio": hsdump / specforge, ...}` plus the versions and the GPU.
SpecForge's `tokens_per_s` is over its batches after the first (its steady rate: the first
batch carries its warm-up, as hsdump's warm-up runs before its clock starts); its whole-run
rate, from process start, is kept beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from hsdump.testing.speed import NotAPair, hsdump_side, pair, specforge_side


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hsdump", required=True, help="bench/bench.py's report (mode b)")
    ap.add_argument("--specforge", required=True, help="reference_capture.py speed --json")
    ap.add_argument("--out", required=True)
    ap.add_argument(
        "--allow-unequal-data",
        action="store_true",
        help="pair runs that wrote different states a token (the file says so, and keeps the "
        "rate per byte beside the ratio)",
    )
    a = ap.parse_args(argv)
    try:
        res = pair(hsdump_side(json.loads(Path(a.hsdump).read_text())),
                   specforge_side(json.loads(Path(a.specforge).read_text())),
                   allow_unequal_data=a.allow_unequal_data)  # fmt: skip
    except NotAPair as e:
        raise SystemExit(f"speed_pair: {e}") from None
    tmp = Path(a.out).with_suffix(".tmp")
    tmp.write_text(json.dumps(res, indent=1) + "\n")
    os.replace(tmp, a.out)
    hs, sf = res["hsdump"], res["specforge"]
    st = res["states_per_token"]
    print(f"| | tokens/s | samples x seq | states a token | bytes a token | durability |\n"
          f"|---|---|---|---|---|---|\n"
          f"| hsdump | {hs['tokens_per_s']:,.0f} | {hs['samples']} x {hs['seq']} | "
          f"{st['hsdump']} | {hs['bytes_per_token']} | {hs['durability']} |\n"
          f"| SpecForge | {sf['tokens_per_s']:,.0f} | {sf['samples']} x {hs['seq']} | "
          f"{st['specforge']} | {sf['bytes_per_token']} | {sf['durability']} |\n"
          f"ratio {res['ratio']} (per byte {res['ratio_per_byte']}), same data: "
          f"{res['same_data']}, same host session: {res['same_host_session']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
