"""The pinned stack on the GPU host, checked piece by piece (run-0523.sh / run-0517.sh import).

    python3 tools/offline_host/import_check.py --out $OUT/import.json

Each check is recorded (ok / error) and the next runs anyway: the python path order (the
staged torch, triton and transformers must come from /tmp/site523, not the image), torch's
CUDA build, a bf16 matmul's TFLOP/s, the NCCL version torch loaded and a one-rank NCCL
all-reduce, cuDNN's state, a triton kernel, sgl_kernel's sm90 ops (its RMSNorm against
torch's), flashinfer's JIT RMSNorm (the path sgl_kernel 0.4.10 takes when flashinfer is
importable: it compiles with the image's nvcc), `import sglang.srt.entrypoints.engine` with
its time, hsdump's capture modules, and every loaded extension module that comes from the
image's site-packages (on the 0523 stack none of them may be built against the image's torch
2.11; on 0517 the image's torch is the one in use), torch.compile of flex_attention (SpecForge's
drafters' attention) and SpecForge's trainer imports where .whl-sf/ is installed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback

R: dict = {"checks": {}}


def check(name):
    def deco(fn):
        t0 = time.time()
        try:
            out = fn()
            R["checks"][name] = {"ok": True, "s": round(time.time() - t0, 2), **(out or {})}
        except BaseException as e:  # noqa: BLE001
            R["checks"][name] = {
                "ok": False,
                "s": round(time.time() - t0, 2),
                "error": f"{type(e).__name__}: {e}"[:2000],
                "traceback": traceback.format_exc()[-4000:],
            }
        print(name, json.dumps(R["checks"][name], default=str)[:600], flush=True)
        return fn

    return deco


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--site", default="/tmp/site523")
    ap.add_argument(
        "--stack", default="0523", help="0523 (torch 2.14.1 staged) or 0517 (the image's)"
    )
    args = ap.parse_args()
    R["stack"] = args.stack
    site = os.path.realpath(args.site)
    R["python"] = sys.version
    R["sys_path_head"] = sys.path[:6]
    R["env"] = {
        k: os.environ.get(k)
        for k in (
            "PYTHONPATH",
            "LD_LIBRARY_PATH",
            "GPU523_CUDNN",
            "GPU523_IMAGE_SITECUSTOMIZE",
            "TRITON_CACHE_DIR",
            "FLASHINFER_WORKSPACE_BASE",
            "CUDA_HOME",
            "NCCL_NVLS_ENABLE",
            "TORCH_SYMM_MEM_DISABLE_MULTICAST",
            "NVSHMEM_DISABLE_NVLS",
        )
    }

    def origin(mod):
        f = getattr(mod, "__file__", "") or ""
        return {"file": f, "staged": os.path.realpath(f).startswith(site)}

    @check("torch")
    def _():
        import torch

        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        for _ in range(3):
            a @ b
        torch.cuda.synchronize()
        t0 = time.time()
        n = 20
        for _ in range(n):
            a @ b
        torch.cuda.synchronize()
        tflops = 2 * 8192**3 * n / (time.time() - t0) / 1e12
        return {
            "version": torch.__version__,
            "cuda": torch.version.cuda,
            "device": torch.cuda.get_device_name(0),
            "capability": list(torch.cuda.get_device_capability(0)),
            "bf16_matmul_tflops": round(tflops, 1),
            "nccl_version": ".".join(map(str, torch.cuda.nccl.version())),
            "cudnn_enabled": bool(torch.backends.cudnn.enabled),
            "cudnn_sdp_enabled": bool(torch.backends.cuda.cudnn_sdp_enabled()),
            **origin(torch),
        }

    @check("nccl_allreduce_1rank")
    def _():
        import torch
        import torch.distributed as dist

        dist.init_process_group(
            "nccl",
            init_method="tcp://127.0.0.1:29531",
            rank=0,
            world_size=1,
            device_id=torch.device("cuda", 0),
        )
        x = torch.ones(1024, device="cuda")
        dist.all_reduce(x)
        torch.cuda.synchronize()
        dist.destroy_process_group()
        return {"sum": float(x.sum())}

    @check("sdpa")
    def _():
        import torch
        import torch.nn.functional as F

        q = torch.randn(2, 8, 512, 128, device="cuda", dtype=torch.bfloat16)
        o = F.scaled_dot_product_attention(q, q, q, is_causal=True)
        torch.cuda.synchronize()
        return {"shape": list(o.shape)}

    @check("triton_kernel")
    def _():
        import torch
        import triton
        import triton.language as tl

        @triton.jit
        def add(x, y, o, n, B: tl.constexpr):
            i = tl.program_id(0) * B + tl.arange(0, B)
            m = i < n
            tl.store(o + i, tl.load(x + i, mask=m) + tl.load(y + i, mask=m), mask=m)

        x = torch.randn(10000, device="cuda")
        o = torch.empty_like(x)
        add[(10,)](x, x, o, 10000, B=1024)
        torch.cuda.synchronize()
        assert torch.allclose(o, 2 * x)
        return {"version": triton.__version__, **origin(triton)}

    @check("transformers")
    def _():
        import transformers

        return {"version": transformers.__version__, **origin(transformers)}

    @check("torchvision")
    def _():
        import torchvision

        return {"version": torchvision.__version__, **origin(torchvision)}

    @check("sgl_kernel_rmsnorm")
    def _():
        import sgl_kernel
        import torch

        x = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
        out = torch.empty_like(x)
        torch.ops.sgl_kernel.rmsnorm.default(out, x, w, 1e-6, False)
        ref = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)) * w.float()
        err = ((out.float() - ref).norm() / ref.norm()).item()
        assert err < 0.02, err
        return {"rel_err": err, **origin(sgl_kernel)}

    @check("flashinfer_rmsnorm_jit")
    def _():
        if os.environ.get("GPU523_FLASHINFER") == "off":
            return {"skipped": "GPU523_FLASHINFER=off"}
        import flashinfer
        import flashinfer.norm
        import torch

        x = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
        out = flashinfer.norm.rmsnorm(x, w, 1e-6)
        ref = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)) * w.float()
        err = ((out.float() - ref).norm() / ref.norm()).item()
        assert err < 0.02, err
        return {"version": flashinfer.__version__, "rel_err": err}

    @check("nvcc")
    def _():
        p = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, timeout=30)
        return {"stdout": p.stdout.strip().splitlines()[-2:]}

    @check("sglang_engine_import")
    def _():
        t0 = time.time()
        import sglang
        from sglang.srt.entrypoints.engine import Engine  # noqa: F401

        return {
            "version": sglang.__version__,
            "import_s": round(time.time() - t0, 1),
            **origin(sglang),
        }

    @check("sglang_scheduler_import")
    def _():
        import sglang.srt.layers.attention.triton_backend  # noqa: F401
        import sglang.srt.managers.scheduler  # noqa: F401
        import sglang.srt.model_executor.model_runner  # noqa: F401
        import sglang.srt.models.deepseek_v2  # noqa: F401
        import sglang.srt.models.kimi_k25  # noqa: F401
        import sglang.srt.models.llama  # noqa: F401

    @check("hsdump_capture_import")
    def _():
        import datasets
        import hydra

        import hsdump.capture.engine  # noqa: F401
        import hsdump.capture.patch  # noqa: F401
        from hsdump.capture.serving import sglang_version

        return {
            "sglang_version": sglang_version(),
            "datasets": datasets.__version__,
            "hydra": hydra.__version__,
        }

    @check("flex_attention_compile")
    def _():
        # SpecForge's default attention for its drafters (DFlash's block mask): torch.compile
        # of flex_attention, forward and backward, on this torch and triton
        import torch
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        def causal(b, h, q, k):
            return q >= k

        mask = create_block_mask(causal, B=None, H=None, Q_LEN=1024, KV_LEN=1024, device="cuda")
        q = torch.randn(2, 8, 1024, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        t0 = time.time()
        fn = torch.compile(flex_attention)
        o = fn(q, q, q, block_mask=mask)
        o.sum().backward()
        torch.cuda.synchronize()
        return {"first_call_s": round(time.time() - t0, 1), "shape": list(o.shape)}

    @check("specforge_trainer_import")
    def _():
        import importlib.util

        if importlib.util.find_spec("specforge") is None:
            return {"skipped": "specforge is not installed (.whl-sf/)"}
        import specforge
        import specforge.algorithms.common.dflash_family_model  # noqa: F401
        import specforge.cli  # noqa: F401
        import specforge.training.assembly  # noqa: F401

        return {"file": specforge.__file__}

    @check("loaded_from_image")
    def _():
        # extension modules (.so) loaded from outside the staged site: each must not link the
        # image's torch 2.11 (torch-dependent ones are carried: torchvision, torchaudio)
        ext, pure = [], set()
        for name, m in list(sys.modules.items()):
            f = getattr(m, "__file__", None) or ""
            if not f or os.path.realpath(f).startswith(site) or "/lib/python3" not in f:
                continue
            if "site-packages" not in f:
                continue
            if f.endswith(".so"):
                ext.append(f)
            pure.add(name.split(".")[0])
        return {"extension_modules": sorted(ext), "packages": sorted(pure)}

    R["ok"] = all(c["ok"] for c in R["checks"].values())
    with open(args.out, "w") as fh:
        json.dump(R, fh, indent=1, default=str)
    print(
        "import check:",
        "ok"
        if R["ok"]
        else "FAILED: " + ", ".join(k for k, c in R["checks"].items() if not c["ok"]),
    )
    return 0 if R["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
