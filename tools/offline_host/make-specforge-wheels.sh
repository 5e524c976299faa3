#!/usr/bin/env bash
# make-specforge-wheels.sh: .whl-sf/ (ignored), what `python3 -m bench.acceptance` needs on the GPU host
# beyond the image, the SGLang bundle and .whl/: SpecForge 0.2.0 (pure Python; its metadata pins
# sglang 0.5.14, torch 2.11.0 and transformers 5.8.1, so it is installed with --no-deps beside the
# bundle's 0.5.23 stack) and accelerate 1.15.0 (SpecForge's trainer imports accelerate.utils; the
# image has this version, carried so the run does not depend on it).
# How the list was made: SpecForge's train (dflash, dspark), export (--to hf, --to sglang) and its
# EAGLE-3 modules run on the CPU with the unpacked wheel on sys.path in hsdump's venv; every module
# they imported was mapped to its distribution and looked up in the image's list
# (image-packages.txt beside this script), .gpu523/WHEELS.txt and .whl/: only accelerate was outside the
# venv, and flash-attn-4, soundfile, zstandard and cuda-tile (guarded, optional imports, as for
# SGLang) are the only ones neither the image nor the bundle has. wandb, yunchang, openai-harmony
# and tensorboard (SpecForge's other requirements) are not imported with report_to=none and
# without USP attention.
# With them, for `run-all --speculators` (EAGLE-3 trained by speculators 0.9.0 too, on hsdump's
# `--to speculators` export): speculators 0.9.0 and hs-connectors 0.9.0 (pure Python; speculators
# allows torch <= 2.14.1 and transformers <= 5.19.0, the pinned stack), pydantic-settings 2.16.3
# and python-dotenv 1.2.4: what its trainer imports beyond the image and the bundle (checked on the
# CPU, 2026-12-03: datasets from .whl/, loguru and openai from the bundle, httpx and rich from the
# image; its trainer trained, and `python3 -m bench.acceptance.speculators convert`'s folder loaded in SGLang 0.5.23's
# LlamaForCausalLMEagle3 with every parameter filled, in hsdump's venv).
# The host installs them with `pip install --no-index --no-deps --target /tmp/site3 .whl-sf/*.whl`
# (run-0523.sh install).
# Also .whl-mla/ (ignored): sgl-flash-mla 1.0.0, a requirement of sglang 0.5.23 that the bundle
# leaves out; SGLang's EAGLE-3 worker imports it when it captures its CUDA graphs (the H200 run
# of 2026-12-03 failed there: No module named 'flash_mla'). 9.9 MB, a folder of its own so that
# it can travel beside a smaller part; `run-0523.sh mla` stashes it, `install` puts it into
# /tmp/site523 with --no-deps.
# Also .whl-gemm/ (ignored): sgl-deep-gemm 0.1.5.post1 (4.8 MB; requires apache-tvm-ffi 0.1.11,
# which the 0517 bundle has), for SGLang 0.5.17, whose EAGLE-3 worker builds its draft CUDA graphs
# through deep_gemm (the 2026-12-01 acceptance run carried it beside the bundle; without it the
# drafters fell back to eager). `run-0517.sh gemm` stashes it, `install` puts it into
# /tmp/site517 with --no-deps (the 0523 bundle has its own sgl-deep-gemm 0.2.3.post2).
set -euo pipefail
ROOT=$(git rev-parse --show-toplevel); cd "$ROOT"
PY=${PYTHON:-python3}
mkdir -p .whl-sf
grep -qx '/.whl-sf/' .git/info/exclude 2>/dev/null || git check-ignore -q .whl-sf || echo '/.whl-sf/' >> .git/info/exclude
git check-ignore -q .whl-sf/x.whl || { echo ".whl-sf/ is not ignored by git" >&2; exit 1; }
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation py \
  -d .whl-sf "specforge==0.2.0" "accelerate==1.15.0" "speculators==0.9.0" "hs-connectors==0.9.0" \
  "pydantic-settings==2.16.3" "python-dotenv==1.2.4"
kernel() {   # FOLDER REQ: a cp312 kernel wheel of its own (ignored) folder, carried beside a part
  mkdir -p "$1"
  grep -qx "/$1/" .git/info/exclude 2>/dev/null || git check-ignore -q "$1" || echo "/$1/" >> .git/info/exclude
  git check-ignore -q "$1/x.whl" || { echo "$1/ is not ignored by git" >&2; exit 1; }
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$1" "$2"
}
kernel .whl-mla "sgl-flash-mla==1.0.0"
kernel .whl-gemm "sgl-deep-gemm==0.1.5.post1"
ls -la .whl-sf .whl-mla .whl-gemm
du -sh .whl-sf .whl-mla .whl-gemm
