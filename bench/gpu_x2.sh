#!/usr/bin/env bash
# Issue 16 item 4 and issue 15 item 4 in one device call on the 2-GPU H200 machine
# (nvidia-h200-x2), from the repository root, carrying .gpu (the SGLang 0.5.17 bundle) and
# .whl (the wheels extract.py needs beyond the image and the bundle):
#   source .gpu/part1/install.sh || exit 1; bash bench/gpu_x2.sh "$OUT"
# Each step runs under its own timeout, so one overrun does not eat the others:
#  (a) bench/gpu_layouts.py --throughput: the capture throughput of the DeepSeek-V3 TP 2
#      layouts tp2-dpattn, tp2, tp2-ep2 (PROMPTS prompts of 2,048 tokens, one timed pass each;
#      a layout that would start past the step's deadline is skipped and says so in the JSON).
#      Step limit TA s.
#  (b) bench/bench.py: the Llama-3.1-8B shape at TP 2, modes a (plain prefill) and b (b0
#      capture only, then b to disk), 512 samples of 2,048 tokens = 1,048,576 tokens per mode,
#      dummy weights, the engine settings of conf/engine/gpu.yaml, mem_fraction_static 0.5.
#      Step limit TB s.
#  (c) bench/gpu_layouts.py: the Llama (hidden 256, 6 layers, DeepSeek tokenizer) through
#      extract.py at TP 1 and TP 2, each against transformers float32 and TP 2 against TP 1.
#      Step limit: what is left of BUDGET s.
# Results under $OUT: gpu-layouts-throughput-x2.json + layouts.log, gpu-llama8b-tp2.json +
# bench.log, gpu-layouts-llama-x2.json + llama.log, host.txt.
set -u
out=${1:?output folder}
TA=${TA:-215}            # step (a) limit, s
BUDGET=${BUDGET:-520}    # this script's whole wall time, s (install.sh runs before it)
PROMPTS=${PROMPTS:-256}  # throughput prompts per DeepSeek-V3 layout
EST=${EST:-60}           # s one throughput layout is expected to take (gpu_layouts' deadline)
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --target /tmp/site2 .whl/*.whl >/dev/null 2>&1 \
    || echo "pip install of .whl failed"
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 PYTHONPATH=.:${PYTHONPATH:-}:/tmp/site2
filter() { grep -v "^\[20\|WARNING\|warn\|Capturing\|it/s\]\|Ignore import error" "$1" | tail -"$2"; }
{
    echo "host: $(nproc) cpus, $(free -g | awk '/Mem:/ {print $2}') GiB"
    df -h /tmp | tail -1
    nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader
    git log -1 --format='commit %h %s' 2>/dev/null; git status --short | head -20
    python3 -c 'import torch, sglang, hydra, datasets; print("gpus", torch.cuda.device_count(),
        "sglang", sglang.__version__, "torch", torch.__version__, "datasets", datasets.__version__)'
} >"$out/host.txt" 2>&1
gpu_free() {  # up to 60 s for the engines of the step before to leave both GPUs
    local used
    for _ in $(seq 60); do
        used=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | sort -n | tail -1)
        [ "${used:-0}" -lt 2048 ] 2>/dev/null && return 0
        sleep 1
    done
    echo "GPU memory still in use (MiB): $(nvidia-smi --query-gpu=memory.used \
        --format=csv,noheader,nounits | tr '\n' ' ')"
}

# (a) issue 16 item 4: the DeepSeek-V3 TP 2 layouts' capture throughput (first: it is what the
# Kimi preset's layout advice rests on)
echo "== (a) gpu_layouts.py throughput, limit $TA s (t=$SECONDS s)"
timeout -k 10 "$TA" python3 bench/gpu_layouts.py --layouts '' \
    --throughput tp2-dpattn,tp2,tp2-ep2 --prompts "$PROMPTS" --repeat 1 \
    --deadline-s $((TA - 25)) --est-throughput-s "$EST" \
    --workdir /tmp/hsdump-x2-layouts --out "$out/gpu-layouts-throughput-x2.json" \
    >"$out/layouts.log" 2>&1
echo "layouts rc=$? (t=$SECONDS s)"
gpu_free

# (b) issue 15 item 4: the 8B shape at TP 2, a vs b over 1,048,576 tokens each
TB=${TB:-185}
echo "== (b) bench.py --tp 2, limit $TB s (t=$SECONDS s)"
timeout -k 10 "$TB" python3 bench/bench.py --device cuda --tp 2 --models llama8b:2048:512:2 \
    --modes a,b --weights dummy --dd-mib 2048 --writer-stages-mib 0 \
    --name gpu-llama8b-tp2 --results-dir "$out" >"$out/bench.log" 2>&1
echo "bench rc=$? (t=$SECONDS s)"
gpu_free

# (c) issue 15 item 4: the Llama through extract.py at TP 1 and TP 2, against transformers
# float32 and TP 2 against TP 1; what is left of BUDGET
TC=$((BUDGET - SECONDS - 8))
echo "== (c) gpu_layouts.py llama-tp1,llama-tp2, limit $TC s (t=$SECONDS s)"
timeout -k 10 "$TC" python3 bench/gpu_layouts.py --layouts llama-tp1,llama-tp2 --throughput '' \
    --extract-timeout-s 150 --workdir /tmp/hsdump-x2-llama --out "$out/gpu-layouts-llama-x2.json" \
    >"$out/llama.log" 2>&1
echo "llama rc=$? (t=$SECONDS s)"

for f in layouts llama; do
echo "== $f.log (filtered)"
grep -E "^== |worst vs|samples_written|\"rc\"|n_row_sources|tokens_per_s\"|engine_start_s|warmup_s|skipped|all_ok|Error|error" \
    "$out/$f.log" | grep -v "^\[20" | tail -25
done
echo "== bench.log (filtered)"
filter "$out/bench.log" 30
echo "done t=$SECONDS s"
