"""Each drafter folder loaded into SGLang's own class for its architecture, on the CPU, in this
one process: SGLang's registry, the class's __init__ from the folder's config, its load_weights
with every parameter's loader call recorded. One `CHECK {json}` line per folder (what was found,
or `error`: what SGLang raised), which `contract.sglang_load` reads:

    python3 -m bench.acceptance.sglang_check TARGET FOLDER...
"""

from __future__ import annotations

import json
import sys
import tempfile


def setup(target: str) -> None:
    """SGLang's CPU process as its scheduler would have it: server args, one rank."""
    from sglang.srt.distributed import init_distributed_environment, initialize_model_parallel
    from sglang.srt.server_args import ServerArgs

    sa = ServerArgs(model_path=target, device="cpu", attention_backend="torch_native",
                    disable_cuda_graph=True, skip_tokenizer_init=True)  # fmt: skip
    try:  # SGLang 0.5.23's runtime context
        from sglang.srt.runtime_context import SpawnRanks, publish

        publish(sa, role="scheduler", ranks=SpawnRanks(world_rank=0, dp_rank=None, gpu_id=0))
    except ImportError:  # 0.5.17's
        from sglang.srt.runtime_context import get_context

        get_context().set_server_args(sa)
    init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                 distributed_init_method="file://" + tempfile.mktemp())  # fmt: skip
    initialize_model_parallel()


def check(folder: str) -> dict:
    from safetensors.torch import load_file
    from sglang.srt.model_loader.weight_utils import default_weight_loader
    from sglang.srt.models.registry import ModelRegistry
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(folder)
    cls = ModelRegistry.resolve_model_cls(cfg.architectures)[0]
    model = cls(cfg)
    params = dict(model.named_parameters())
    loaded = set()
    for name, param in params.items():  # every loader call of SGLang's load_weights, recorded
        orig = getattr(param, "weight_loader", default_weight_loader)

        def record(p, *x, _name=name, _orig=orig):
            loaded.add(_name)
            return _orig(p, *x)

        param.weight_loader = record
    weights = load_file(folder + "/model.safetensors")
    model.load_weights(list(weights.items()))
    out = dict(cls=cls.__name__, params=sorted(params), loaded=sorted(loaded),
               tensors=sorted(weights))  # fmt: skip
    if cfg.architectures[0] == "LlamaForCausalLMEagle3":
        out.update(aux_ids=list(cfg.eagle_config["eagle_aux_hidden_state_layer_ids"]),
                   norm_before_fc=bool(model.model.norm_before_fc),
                   norm_output=bool(model.model.norm_output))  # fmt: skip
    else:
        from sglang.srt.speculative.dflash_utils import parse_dflash_draft_config

        d = parse_dflash_draft_config(draft_hf_config=cfg)
        out.update(target_layer_ids=list(d.target_layer_ids), mask_token_id=d.mask_token_id,
                   block_size=d.block_size, num_context_features=int(model.num_context_features))  # fmt: skip
    return out


def main(argv=None) -> int:
    target, *folders = sys.argv[1:] if argv is None else argv
    from hsdump.capture.patch import prepare_process

    prepare_process("cpu")  # before SGLang is imported
    setup(target)
    for folder in folders:
        try:
            out = check(folder)
        except Exception as e:  # noqa: BLE001 - reported per folder
            out = dict(error=f"{type(e).__name__}: {e}")
        print("CHECK " + json.dumps(dict(folder=folder, **out)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
