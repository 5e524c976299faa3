"""A fault in SpecForge's trainer at one step, once (the marker file): the error a CUDA fault
raises on the GPU host, from inside SpecForge's own train_step. On PYTHONPATH this folder's
sitecustomize patches SpecForge's controller when the trainer imports it; $FAULT names a JSON
file {"at": step, "mark": path} (none: no fault). tests/test_acceptance_train.py's resume test."""

import importlib.abc
import importlib.util
import json
import os
import sys

_f = os.environ.get("FAULT", "")
AT, MARK = json.load(open(_f)).values() if _f and os.path.exists(_f) else (0, "")


class Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "specforge.training.controller":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            step = module.TrainerCore.train_step

            def train_step(self, batch, ctx=None, **kw):
                if ctx.global_step + 1 == AT and not os.path.exists(MARK):
                    open(MARK, "w").close()
                    raise RuntimeError("CUDA error: unspecified launch failure (the test's)")
                return step(self, batch, ctx=ctx, **kw)

            module.TrainerCore.train_step = train_step

        spec.loader.exec_module = exec_module
        return spec


if AT:
    sys.meta_path.insert(0, Hook())
