#!/usr/bin/env bash
# make-bundle.sh [STACK]: a pinned GPU stack for the offline H200 host, whose image has python
# 3.12.3, torch 2.11.0+cu130, transformers 5.17.0, triton 3.6.0, NCCL 2.28.9 and cuDNN 9.19.
#   STACK 0523 (default): hsdump's own, SGLang 0.5.23 with torch 2.14.1 (requirements.txt);
#   STACK 0514: SpecForge 0.2.0's pins, SGLang 0.5.14 with the image's torch 2.11.0 and
#               transformers 5.8.1, for its own offline capture beside hsdump's
#               (bench/reference_capture.py; run-0523.sh stash514, install514).
#   STACK 0517: SGLang 0.5.17 + sgl-kernel 0.4.5 over the image's own torch 2.11.0 and
#               transformers 5.17.0 (one part of about 48 MiB; run-0517.sh: the acceptance
#               benchmark's stack, README.md "The host image's own stack").
#
# Run from anywhere inside the checkout, on a machine whose pip reaches PyPI:
#     tools/offline_host/make-bundle.sh [0523|0514|0517]
# It commits nothing. It writes
#   .gpu523/, .gpu514/ or .gpu517/pNN/ (ignored: the folder goes into .git/info/exclude) parts of at most
#                       PART_MB MiB, each with a copy of MANIFEST; copy them to the host
#   $BUILD_DIR          (default /tmp/sglang523-bundle or /tmp/sglang514-bundle: wheels, kept and reused; the unpacked
#                       site is deleted after packing)
# and tools/offline_host/run-0523.sh installs it on the host (README.md beside this file).
#
# What travels:
#   * torch, triton and nvidia-nccl-cu13 (0523 only) as their wheels, unchanged (already
#     deflated; xz gains little on them and would cost the host a slow single-threaded
#     decompress), split into parts;
#   * everything else installed here into one site folder (pip --target, no deps, cp312 tags),
#     trimmed (FA3/FlashMLA/InfLLM/sm100 kernels, xgrammar's static lib and headers, bin/,
#     __pycache__) and packed as site.tar.xz.
#   * WITH_CUDNN=1 (0523) adds nvidia-cudnn-cu13 9.24.0.43 (553 MB, ~10 more parts); by default
#     the host disables cuDNN instead (run-0523.sh's sitecustomize: torch 2.14.1 was built
#     against 9.24 and refuses the image's 9.19).
#
# Knobs: BUILD_DIR, PART_MB=58, XZ_LEVEL=9, PYTHON=python3, WITH_CUDNN=0, WHEEL_CACHE=DIR
set -euo pipefail

STACK=${1:-0523}
ROOT=$(git rev-parse --show-toplevel)
cd "$ROOT"
BUILD=${BUILD_DIR:-/tmp/sglang${STACK#0}-bundle}
PART_MB=${PART_MB:-58}
XZ_LEVEL=${XZ_LEVEL:-9}
PY=${PYTHON:-python3}
WITH_CUDNN=${WITH_CUDNN:-0}
OUTDIR=.gpu${STACK#0}

# What every stack carries beyond the image (what the offline Engine import and run path needs
# that the image lacks, checked against its package list).
COMMON=(
  pyzmq==27.3.0
  orjson==3.13.0
  pybase64==1.5.1
  msgspec==0.22.0
  setproctitle==1.3.8
  dill==0.4.1
  pydantic==2.14.4
  pydantic-core==2.50.5
  typing-inspection==0.4.5
  annotated-types==0.8.0
  typing-extensions==4.16.0
  jiter==0.19.0
  sniffio==1.3.1
  distro==1.9.0
  partial-json-parser==0.2.1.1.post7
  compressed-tensors==0.18.0
  loguru==0.7.3
  gguf==0.19.0
  fastapi==0.165.0
  starlette==1.10.0
  opentelemetry-api==1.45.2
  uvicorn==0.54.0
  ipython==9.18.1
  traitlets==5.16.1
  ipython-pygments-lexers==1.1.1
  jedi==0.20.1
  parso==0.8.7
  decorator==5.2.1
  prompt-toolkit==3.0.53
  wcwidth==0.9.4
  pexpect==4.9.0
  ptyprocess==0.7.0
  matplotlib-inline==0.2.2
  stack-data==0.6.3
  executing==2.3.0
  asttokens==3.0.2
  pure-eval==0.2.4
)

case "$STACK" in
0523)
# Carried as wheels (extracted on the host).
RAW=(
  torch==2.14.1
  triton==3.8.0
  nvidia-nccl-cu13==2.30.7
)
[ "$WITH_CUDNN" = 1 ] && RAW+=(nvidia-cudnn-cu13==9.24.0.43)
# Installed here into site/ and packed. Versions: what sglang 0.5.23 pins, else what pip resolved
# for it (requirements.lock). The set: what `import sglang.srt.entrypoints.engine`, the
# scheduler, model runner, the llama/deepseek_v2/kimi_k25/qwen*/glm4_moe/gemma3/gpt_oss model
# files, the triton attention backend, fused MoE and compressed-tensors import on CUDA (faked on
# a CPU machine), allowing only the image's package list plus this bundle; the 0.5.17 bundle's
# list plus transformers 5.19.0 (sglang's pin; the image has 5.17.0), torchvision 0.29.1 (the
# image's 0.26.0 is built for torch 2.11 and transformers imports it when present), torchaudio
# 2.11.0 (sglang's pin, the image's version, carried so nothing of the image's torch-built set
# is loaded), sgl-deep-gemm (fp8 GEMMs, DeepSeek-V3.2/V4; optional on the Llama/Kimi path),
# sgl-flash-mla (sglang 0.5.23 requires it; its EAGLE-3 worker imports it for CUDA graphs).
WHEELS=(
  sglang==0.5.23
  sglang-kernel==0.4.10
  flashinfer-python==0.7.2
  apache-tvm-ffi==0.1.11
  sgl-deep-gemm==0.2.3.post2
  sgl-flash-mla==1.0.0
  transformers==5.19.0
  nvidia-cutlass-dsl==4.8.0
  nvidia-cutlass-dsl-libs-base==4.8.0
  nvidia-cutlass-dsl-libs-core==4.8.0
  nvidia-cutlass-dsl-libs-cu12==4.8.0
  nvidia-cutlass-dsl-libs-cu13==4.8.0
  torchvision==0.29.1
  torchaudio==2.11.0
  xgrammar==0.2.7
  openai==2.8.0
  "${COMMON[@]}"
)
;;
0514)
# torch 2.11.0 is the image's own (SpecForge 0.2.0 and SGLang 0.5.14 pin it): nothing raw.
RAW=()
# SGLang 0.5.14's own pins (sglang-kernel, flashinfer, apache-tvm-ffi, transformers, xgrammar,
# openai), with the common set; flashinfer's cubin package (447 MB) is left out: flashinfer
# builds its kernels on first use, as on the other stacks.
# tokenizers 0.22.2: transformers 5.8.1 requires tokenizers <= 0.23.0 and refuses the image's
# 0.23.2 at import (H200 host, 2026-12-04; there is no 0.23.0 final on PyPI). cuda-tile 1.7.0
# (`cuda.tile`, a namespace package beside the image's cuda-bindings): flashinfer 0.6.12's
# comm/all_gather_matmul imports it without a guard, and SpecForge's capture module reaches it
# through SGLang's batching code (`import514` failed there on the same image).
WHEELS=(
  sglang==0.5.14
  sglang-kernel==0.4.4
  flashinfer-python==0.6.12
  apache-tvm-ffi==0.1.9
  transformers==5.8.1
  tokenizers==0.22.2
  cuda-tile==1.7.0
  xgrammar==0.2.1
  openai==2.6.1
  "${COMMON[@]}"
)
;;
0517)
# torch 2.11.0 and transformers 5.17.0 are the image's own: nothing raw. SGLang 0.5.17's pins
# (sglang-kernel 0.4.5, flashinfer 0.6.15.post1, apache-tvm-ffi, xgrammar, openai) with the
# common set; the image's transformers is kept (SGLang 0.5.17 pins 5.12.1): the site build
# patches the one place 0.5.17 clashes with 5.17 (its qwen3_asr config registration).
WHEELS=(
  sglang==0.5.17
  sglang-kernel==0.4.5
  flashinfer-python==0.6.15.post1
  apache-tvm-ffi==0.1.11
  xgrammar==0.2.1
  openai==2.6.1
  "${COMMON[@]}"
)
;;
*) echo "make-bundle.sh: unknown stack '$STACK' (0523, 0514 or 0517)" >&2; exit 2 ;;
esac

PLAT=(--only-binary=:all: --python-version 3.12 --implementation cp
      --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64
      --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64
      --platform manylinux_2_24_x86_64 --platform manylinux_2_18_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
      --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64)

mkdir -p "$BUILD/wheels"
if [ -n "${WHEEL_CACHE:-}" ] && [ -d "$WHEEL_CACHE" ]; then
  cp -n "$WHEEL_CACHE"/*.whl "$BUILD/wheels/" 2>/dev/null || true
fi

wheel_of() {  # the downloaded wheel file of NAME==VER, or nothing
  local name=${1%%==*} ver=${1##*==}
  local norm; norm=$(echo "$name" | tr 'A-Z-' 'a-z_')
  (cd "$BUILD/wheels" && ls | awk -v n="$norm" -v v="$ver" '{ s=tolower($0); if (index(s, n "-" v "-")==1) print $0 }' | head -1)
}

echo "== downloading cp312 wheels into $BUILD/wheels (files already there are reused)"
NEED=()
for spec in "${RAW[@]}" "${WHEELS[@]}"; do
  [ -n "$(wheel_of "$spec")" ] || NEED+=("$spec")
done
if [ ${#NEED[@]} -gt 0 ]; then
  "$PY" -m pip download -q --no-deps "${PLAT[@]}" -d "$BUILD/wheels" "${NEED[@]}" 2>&1 \
    | grep -v "^WARNING: Location" || true
fi
SEL=(); RAWSEL=()
for spec in "${WHEELS[@]}"; do
  f=$(wheel_of "$spec"); [ -n "$f" ] || { echo "missing wheel for $spec" >&2; exit 1; }
  SEL+=("$BUILD/wheels/$f")
done
for spec in "${RAW[@]}"; do
  f=$(wheel_of "$spec"); [ -n "$f" ] || { echo "missing wheel for $spec" >&2; exit 1; }
  RAWSEL+=("$BUILD/wheels/$f")
done

# site.tar.xz is kept in $BUILD and rebuilt only when the wheel list or this script changes
STAMP=$( (printf '%s\n' "${WHEELS[@]}"; sed -n '/^# ---- site build/,/^# ---- end site build/p' "$0") | sha256sum | cut -c1-16)
PAY="$BUILD/payload"
rm -rf "$PAY" && mkdir -p "$PAY"
if [ -f "$BUILD/site.tar.xz" ] && [ "$(cat "$BUILD/site.stamp" 2>/dev/null)" = "$STAMP" ] && [ "${FORCE:-0}" != 1 ]; then
  echo "== reusing $BUILD/site.tar.xz (stamp $STAMP; FORCE=1 rebuilds)"
else
# ---- site build
echo "== installing ${#SEL[@]} wheels into $BUILD/site (no deps, cp312 tags)"
S="$BUILD/site"
rm -rf "$S"
"$PY" -m pip install -q --no-deps --no-compile --no-cache-dir "${PLAT[@]}" \
  --target "$S" "${SEL[@]}" 2>&1 | grep -v "^WARNING: Location" || true
test -f "$S/sglang/__init__.py" && test -f "$S/sgl_kernel/sm90/common_ops.abi3.so"

echo "== trimming"
# sgl_kernel 0.4.10 loads sm90/common_ops.abi3.so on cc 9.0 at import; FA3 (flash_ops, 1.1 GB),
# FlashMLA and InfLLM load lazily, only for those attention backends; sm100/ only on Blackwell.
rm -f  "$S"/sgl_kernel/flash_ops.abi3.so "$S"/sgl_kernel/flashmla_ops.abi3.so \
       "$S"/sgl_kernel/infllm_ops*.so
rm -rf "$S"/sgl_kernel/sm100
# xgrammar: static library + headers are build-time only.
rm -rf "$S"/xgrammar/lib/*.a "$S"/xgrammar/include
# console scripts carry this machine's interpreter path.
rm -rf "$S"/bin
find "$S" -name __pycache__ -type d -prune -exec rm -rf {} +
# the image's sitecustomize stays reachable: ours comes from run-0523.sh, not from a wheel
rm -f "$S"/sitecustomize.py
if [ "$STACK" = 0517 ]; then
  # SGLang 0.5.17 registers its own 'qwen3_asr' configs with AutoConfig; the image's
  # transformers 5.17.0 ships them too, and `import sglang.srt.entrypoints.engine` raises
  # "'qwen3_asr' is already used": both registrations take exist_ok=True
  "$PY" - "$S/sglang/srt/configs/qwen3_asr.py" <<'PYEOF'
import re, sys
p = sys.argv[1]
s = open(p).read()
n = 0
for name in ("Qwen3ASRConfig", "Qwen3ASRThinkerConfig"):
    pat = re.compile(r'^AutoConfig\.register\(("qwen3_asr(?:_thinker)?"), %s\)$' % name, re.M)
    s, k = pat.subn(r'AutoConfig.register(\1, %s, exist_ok=True)' % name, s)
    n += k
if n != 2:
    sys.exit("qwen3_asr patch did not apply (%d of 2)" % n)
open(p, "w").write(s)
print("patched", p)
PYEOF
fi

echo "== packing site.tar.xz (xz -$XZ_LEVEL; about 15 min on 2 busy cores)"
du -sh "$S" | sed 's/^/unpacked: /'
tar -C "$S" --sort=name --owner=0 --group=0 -cf - . | xz -T0 -"$XZ_LEVEL" > "$BUILD/site.tar.xz.tmp"
mv "$BUILD/site.tar.xz.tmp" "$BUILD/site.tar.xz"
echo "$STAMP" > "$BUILD/site.stamp"
rm -rf "$S"   # the unpacked intermediate
# ---- end site build
fi
ln -f "$BUILD/site.tar.xz" "$PAY/site.tar.xz"
for w in "${RAWSEL[@]}"; do ln -f "$w" "$PAY/" 2>/dev/null || cp "$w" "$PAY/"; done
ls -l "$PAY"

echo "== laying out $OUTDIR/pNN (<= $PART_MB MiB each)"
EXCL=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$EXCL")"
grep -qxF "/$OUTDIR/" "$EXCL" 2>/dev/null || echo "/$OUTDIR/" >> "$EXCL"
rm -rf "$OUTDIR" && mkdir -p "$OUTDIR"
"$PY" - "$PAY" "$OUTDIR" "$PART_MB" <<'PYEOF'
import hashlib, os, sys
pay, out, part_mb = sys.argv[1], sys.argv[2], int(sys.argv[3])
cap = part_mb << 20
files = sorted(os.listdir(pay), key=lambda f: (f != "site.tar.xz", f))  # site first
manifest = []
for f in files:
    p = os.path.join(pay, f)
    h = hashlib.sha256()
    with open(p, "rb") as fh:
        for b in iter(lambda: fh.read(1 << 24), b""):
            h.update(b)
    manifest.append([f, h.hexdigest(), 0, os.path.getsize(p)])
# one stream over all files, cut every `cap` bytes: a part holds the tail of one file and the
# head of the next; each file's pieces are numbered in order across the parts
parts, cur, room = [], [], cap
for m in manifest:
    f, size, off = m[0], m[3], 0
    while off < size:
        n = min(room, size - off)
        cur.append((f"{f}.{m[2]:03d}", f, off, n))
        m[2] += 1
        off += n
        room -= n
        if room == 0:
            parts.append(cur); cur, room = [], cap
if cur:
    parts.append(cur)
manifest = [f"FILE {f} {sha} {n} {size}" for f, sha, n, size in manifest]
for line in manifest:
    print("  " + line.split()[1] + ": " + line.split()[3] + " piece(s)")
bid = hashlib.sha256(("stream %d\n" % cap + "\n".join(manifest)).encode()).hexdigest()[:16]
text = f"BUNDLE_ID={bid}\nNPARTS={len(parts)}\n" + "\n".join(manifest) + "\n"
for i, part in enumerate(parts):
    d = os.path.join(out, f"p{i:02d}")
    os.makedirs(d)
    for name, f, off, n in part:
        with open(os.path.join(pay, f), "rb") as src, open(os.path.join(d, name), "wb") as fh:
            src.seek(off)
            fh.write(src.read(n))
    with open(os.path.join(d, "MANIFEST"), "w") as fh:
        fh.write(text)
with open(os.path.join(out, "MANIFEST"), "w") as fh:
    fh.write(text)
print(f"bundle {bid}: {len(parts)} part(s)")
PYEOF
printf '%s\n' "${RAW[@]}" "${WHEELS[@]}" > "$OUTDIR/WHEELS.txt"
rm -rf "$PAY"

git check-ignore -q "$OUTDIR/p00/MANIFEST" || { echo "$OUTDIR is not ignored!" >&2; exit 1; }
n=$(ls -d "$OUTDIR"/p* | wc -l)
du -sh "$OUTDIR"/p* | sed 's/^/  /'
echo
echo "On the host, from the checkout's root, with each part copied to $OUTDIR/pNN (NN = 00 .. $(printf %02d $((n-1)))):"
if [ "$STACK" = 0523 ]; then
  echo "  bash tools/offline_host/run-0523.sh stash NN        (once per part)"
  echo "then, with .whl/ (tools/offline_host/make-whl.sh) beside them:"
  echo "  bash tools/offline_host/run-0523.sh install import"
elif [ "$STACK" = 0517 ]; then
  echo "  bash tools/offline_host/run-0517.sh stash NN        (once per part)"
  echo "then, with .whl/ (make-whl.sh) and .whl-sf/ (make-specforge-wheels.sh) beside them:"
  echo "  bash tools/offline_host/run-0517.sh install import"
else
  echo "  bash tools/offline_host/run-0523.sh stash514 NN     (once per part)"
  echo "then, with .whl-sf/ (tools/offline_host/make-specforge-wheels.sh) beside them:"
  echo "  bash tools/offline_host/run-0523.sh install514 import514"
fi
