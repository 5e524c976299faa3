"""SGLang's own capture under a drafter kind's layer-id convention (no hsdump patch).

`python tests/kind_probe.py MODEL KIND IDS OUT.safetensors [cpu|cuda]`: starts `sglang.Engine`
(on the CPU by default) in its capture-only mode (`speculative_algorithm=KIND` names the convention,
`enable_return_aux_hidden_states=True`, `return_aux_hidden_state_layer_ids=IDS`, the serving ids
a drafter's config carries), prefills two prompts with `return_hidden_states=True`, and saves
each prompt's prefill rows as `rows/{j}` (`[seq, K * hidden]`) with its token ids `ids/{j}`.
tests/test_kinds.py compares them with transformers' hidden_states at the indices hsdump maps
those ids to (hsdump.capture.kinds).
"""

import json
import sys

PROMPTS = [[5, 17, 99, 3, 250, 41, 7, 8, 301, 12, 66], list(range(20, 57))]


def main() -> None:
    model, kind, ids, out = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
    device = sys.argv[5] if len(sys.argv) > 5 else "cpu"
    from hsdump.capture.patch import prepare_process

    prepare_process(device)  # on the CPU: the libcuda stub and SGLANG_USE_CPU_ENGINE
    import sglang
    import torch
    from safetensors.torch import save_file

    on_device = (
        {"attention_backend": "torch_native", "mem_fraction_static": 0.3}
        if device == "cpu"
        else {"mem_fraction_static": 0.5, "enable_multimodal": False}
    )
    engine = sglang.Engine(
        model_path=model,
        device=device,
        sampling_backend="pytorch",
        skip_tokenizer_init=True,
        disable_radix_cache=True,
        chunked_prefill_size=-1,
        max_total_tokens=4096,
        max_running_requests=4,
        disable_cuda_graph=True,
        **on_device,
        enable_return_hidden_states=True,
        speculative_algorithm=kind.upper(),
        enable_return_aux_hidden_states=True,
        return_aux_hidden_state_layer_ids=ids,
        log_level="error",
    )
    try:
        outs = engine.generate(
            input_ids=PROMPTS,
            sampling_params={"max_new_tokens": 1, "temperature": 0.0},
            return_hidden_states=True,
        )
    finally:
        engine.shutdown()
    tensors = {}
    for j, (prompt, o) in enumerate(zip(PROMPTS, outs)):
        rows = torch.tensor(o["meta_info"]["hidden_states"][0], dtype=torch.float32)
        tensors[f"rows/{j}"] = rows.reshape(len(prompt), -1).contiguous()
        tensors[f"ids/{j}"] = torch.tensor(prompt, dtype=torch.int64)
    save_file(tensors, out)


if __name__ == "__main__":
    main()
