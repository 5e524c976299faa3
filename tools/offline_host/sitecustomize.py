"""Copied into /tmp/site523 by run-0523.sh install; runs at the start of every python process
there (PYTHONPATH puts /tmp/site523 first, and SGLang's scheduler and detokenizer processes
inherit it), so the settings below reach every process of an engine.

GPU523_CUDNN=off (default): torch 2.14.1 was built against cuDNN 9.24 and the image has 9.19,
so cuDNN's init raises; once torch is imported, `torch.backends.cudnn.enabled = False` and
cuDNN SDPA off. GPU523_CUDNN=on leaves cuDNN alone (the 9.24 wheel was carried:
make-bundle.sh WITH_CUDNN=1). GPU523_CUDNN=skipcheck sets
PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK=1 and runs the image's 9.19 (untested).

The hook touches nothing but the `torch` import; no module is imported here. An image
sitecustomize further down sys.path (this file shadows it) is run after it.
"""

import os
import sys

_mode = os.environ.get("GPU523_CUDNN", "off")
if _mode == "skipcheck":
    os.environ.setdefault("PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK", "1")
elif _mode == "off":
    import importlib.machinery

    class _TorchCudnnOff:
        def find_spec(self, name, path=None, target=None):
            if name != "torch":
                return None
            sys.meta_path.remove(self)
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return spec
            orig = spec.loader.exec_module

            def exec_module(module):
                orig(module)
                try:
                    module.backends.cudnn.enabled = False
                    module.backends.cuda.enable_cudnn_sdp(False)
                except Exception as e:  # noqa: BLE001
                    print(
                        f"[gpu523 sitecustomize] could not turn cuDNN off: {e!r}", file=sys.stderr
                    )

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _TorchCudnnOff())

# the image's own sitecustomize, if it has one, still runs
_here = os.path.dirname(os.path.abspath(__file__))
for _d in sys.path:
    _p = os.path.join(_d or ".", "sitecustomize.py")
    if os.path.abspath(_d or ".") != _here and os.path.isfile(_p):
        os.environ.setdefault("GPU523_IMAGE_SITECUSTOMIZE", _p)
        with open(_p) as _f:
            exec(compile(_f.read(), _p, "exec"), {"__name__": "sitecustomize", "__file__": _p})
        break
