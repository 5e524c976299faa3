#!/usr/bin/env bash
# The reference side of bench/reference_capture.py: a venv holding SpecForge 0.2.0 with the SGLang
# it pins (0.5.14, which pins torch 2.11.0 and transformers 5.8.1), apart from hsdump's own venv
# (SGLang 0.5.23, torch 2.14.1). Everything comes from PyPI through pip's ordinary resolver.
#
#   tools/reference/make-venv-sf514.sh [VENV]       # default: .venv-sf514 in the repository root
#
# On a machine without a GPU, SGLang's CUDA kernel package needs libcuda.so.1 to import; the
# worker (bench/reference_specforge_worker.py) builds hsdump's stub for that at run time, so
# nothing of the kind is installed here.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
VENV="${1:-$ROOT/.venv-sf514}"
PY="${PYTHON:-python3}"

"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install --disable-pip-version-check -q --upgrade pip
# sglang 0.5.14 pulls torch 2.11.0, transformers 5.8.1, sglang-kernel 0.4.4 and the rest of its
# pins; specforge 0.2.0 is a pure-Python wheel whose own requirements are already met by them
# (installed with its dependencies so that pip reports any conflict).
"$VENV/bin/python" -m pip install --disable-pip-version-check \
    "sglang==0.5.14" "specforge==0.2.0"
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
for name in ("specforge", "sglang", "sglang-kernel", "torch", "transformers", "safetensors"):
    try:
        print(f"{name}=={md.version(name)}")
    except md.PackageNotFoundError:
        print(f"{name}: absent")
PY
touch "$VENV/.installed"
