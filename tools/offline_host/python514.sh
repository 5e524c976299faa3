#!/usr/bin/env bash
# python514.sh: the image's python3 on SpecForge 0.2.0's own stack (make-bundle.sh 0514, installed
# by run-0523.sh install514): /tmp/site514 (SGLang 0.5.14, transformers 5.8.1), /tmp/site3
# (SpecForge) and /tmp/site2 over the image's torch 2.11.0, whatever environment the caller runs in (hsdump's
# 0.5.23 steps export /tmp/site523 on PYTHONPATH and its NCCL on LD_LIBRARY_PATH: both are
# replaced here). bench/reference_capture.py takes it as --python for SpecForge's side.
# /tmp/site2 (.whl/, run-0523.sh install) for `datasets`, which SpecForge's data utilities import
# and the image lacks (bundle_view.py found it)
export PYTHONPATH="${SITE514:-/tmp/site514}:${SITE3:-/tmp/site3}:${SITE2:-/tmp/site2}"
# the image's own entries stay; those of the 0.5.23 bundle go
LD_LIBRARY_PATH=$(printf '%s' "${LD_LIBRARY_PATH:-}" | tr ':' '\n' | grep -v '^/tmp/site523' | paste -sd: -)
export LD_LIBRARY_PATH
export TRITON_CACHE_DIR=/tmp/gpu523-cache/triton514
export FLASHINFER_WORKSPACE_BASE=/tmp/gpu523-cache/fi514
export TORCHINDUCTOR_CACHE_DIR=/tmp/gpu523-cache/inductor514
exec python3 "$@"
