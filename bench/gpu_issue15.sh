#!/usr/bin/env bash
# Issue 15's GPU runs (BENCHMARKS.md section 8): the benchmark at the widths users run, with
# today's writer defaults (6 threads x 256 MiB shards), fp8 storage beside bf16 in one run.
# Two device calls of under 10 minutes each on one H200, from the repository root, with the
# .gpu bundle carried:
#   source .gpu/part1/install.sh || exit 1; bash bench/gpu_issue15.sh 1 "$OUT"
#   source .gpu/part1/install.sh || exit 1; bash bench/gpu_issue15.sh 2 "$OUT"
# Weights: SGLang's load_format=dummy (config.json only; no build, nothing on the disk the
# dataset is written to); bench.py falls back to save_pretrained files if that fails.
set -u
step=${1:?step 1 or 2}
out=${2:?output folder}
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 PYTHONPATH=.:${PYTHONPATH:-}
filter() { grep -v "^\[20\|WARNING\|warn\|^  warnings\|Capturing\|it/s\]" "$1" | tail -70; }
host() {
    echo "host: $(nproc) cpus, $(free -g | awk '/Mem:/ {print $2}') GiB"
    df -h /tmp | tail -1
    nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader
    git log -1 --format='commit %h %s' 2>/dev/null; git status --short hsdump | head -20
} >"$out/host.txt" 2>&1
host
case $step in
1)  # Llama-3.1-8B shape at 2,048 tokens: a, b0, b with 512 samples (1,048,576 tokens) each,
    # b8 (fp8) on the first 256 samples on b's engine, then c (2 samples) if time is left
    # (as run: 383 s, c skipped)
    timeout -k 10 470 python3 bench/bench.py --device cuda --models llama8b:2048:512:2 \
        --modes a,b,b8,c --weights dummy --fp8-tokens 524288 --dd-mib 2048 \
        --writer-stages-mib 0 --deadline-s 330 --deadline-modes c \
        --name gpu-llama8b-issue15 --results-dir "$out" >"$out/bench.log" 2>&1
    echo "bench rc=$?"; filter "$out/bench.log" ;;
2)  # Kimi-K2.5 widths (hidden 7168, its MLA dims and expert width; 8 layers, 16 experts,
    # top-8), layers [3, 5, 6]: a, b0, b on 160 samples of 2,048 tokens, b8 on the first 48,
    # c on 2 if time is left (as run: 210 s, c skipped; N2, F2, T2, D2 give more where time
    # allows). No CUDA graphs in any mode: MLA runs no prefill graph, and the decode graphs
    # (never replayed with max_new_tokens=1) took engine-start time the call lacked
    timeout -k 10 "${T2:-262}" python3 bench/bench.py --device cuda \
        --models "kimi-width:2048:${N2:-160}:2" --modes a,b,b8,c --weights dummy \
        --no-cuda-graph --fp8-tokens "${F2:-98304}" --dd-mib 1024 --writer-stages-mib 0 \
        --deadline-s "${D2:-232}" --deadline-modes c \
        --name gpu-kimi-width-issue15 --results-dir "$out" >"$out/bench.log" 2>&1
    echo "bench rc=$?"; filter "$out/bench.log" ;;
*)  echo "step must be 1 or 2" >&2; exit 2 ;;
esac
