"""Data-parallel attention through hsdump's real capture patch, on the CPU.

Under `enable_dp_attention` every DP group runs its own requests, and a group with nothing to
do in a step still runs the model with the others (their MoE collectives need it): an idle
forward of 0 tokens, or one padded to the others' length and relabelled EXTEND. These tests
install hsdump's patch (`patch._install_patch`, the code every scheduler process runs) over
stand-ins for SGLang's stock `LogitsProcessor.forward` and `process_batch_result_prefill`,
feed it SGLang's own metadata and result types, and check that

* an idle forward passes through the logits hook untouched (the GPU crash this fixes:
  `pack_rows` reshaping 0 rows to [0, -1, H]);
* each DP rank sends the rows of the requests it ran, once, under its own name, in mixed
  steps (one rank idle, the other not) and with a request prefilled in chunks;
* a request sent by two processes, or rows sent again, fail instead of being merged;
* layouts hsdump cannot capture exactly are refused before an engine starts.
"""

import types

import pytest
import torch

from hsdump.capture import patch, serving
from hsdump.capture.rows import CaptureError, Receiver, pack_rows, unpack_rows

H = 16
LAYERS = [3, 1]  # hf_hidden_states_index; aux rows arrive sorted: slot 0 = layer 1


@pytest.fixture
def sgl(monkeypatch):
    """SGLang's modules, with the three methods hsdump wraps restored after the test."""
    # as CaptureEngine does in-process: the libcuda stub stays loaded and on LD_LIBRARY_PATH
    # (later engine tests' spawned processes need it; the loaded stub is not loaded again)
    patch.prepare_process("cpu")
    from sglang.srt.layers import logits_processor as lp
    from sglang.srt.managers.scheduler_components import batch_result_processor as brp
    from sglang.srt.model_executor import forward_batch_info as fbi
    from sglang.srt.model_executor import model_runner as mr

    for cls, name in (
        (mr.ModelRunner, "load_model"),
        (lp.LogitsProcessor, "forward"),
        (brp.SchedulerBatchResultProcessor, "process_batch_result_prefill"),
    ):
        monkeypatch.setattr(cls, name, getattr(cls, name))  # undo puts the stock one back
    patch._STASH.clear()
    yield types.SimpleNamespace(lp=lp, brp=brp, fbi=fbi, monkeypatch=monkeypatch)
    patch._STASH.clear()


def stock_logits_forward(lp):
    """Stands in for SGLang's LogitsProcessor.forward under CaptureHiddenMode.FULL: the aux
    states come back packed as `hidden_states` (SGLang's own pack_aux_hidden_states)."""
    from sglang.srt.layers.aux_hidden_states import pack_aux_hidden_states

    def forward(
        self,
        input_ids,
        hidden_states,
        lm_head,
        logits_metadata,
        aux_hidden_states=None,
        hidden_states_before_norm=None,
    ):
        aux = None if aux_hidden_states is None else pack_aux_hidden_states(aux_hidden_states)
        return lp.LogitsProcessorOutput(
            next_token_logits=hidden_states.new_zeros(hidden_states.shape[0], 8), hidden_states=aux
        )

    return forward


class Rank:
    """One scheduler process's patched methods (each `_install_patch` call has its own
    closure and so its own row sender, as each process has)."""

    def __init__(self, sgl, endpoint, source, final=()):
        self.sgl, self.source, self.prefilled = sgl, source, []
        sgl.monkeypatch.setattr(sgl.lp.LogitsProcessor, "forward", stock_logits_forward(sgl.lp))
        sgl.monkeypatch.setattr(
            sgl.brp.SchedulerBatchResultProcessor,
            "process_batch_result_prefill",
            lambda proc, batch, result: self.prefilled.append(batch),
        )
        patch._install_patch(
            {
                "rows": {"endpoint": endpoint},
                "node_rank": 0,
                "layers": LAYERS,
                "final": list(final),
                "device": "cpu",
                "slots": len(LAYERS) + len(final),
                "hidden": H,
            }
        )
        self.logits = sgl.lp.LogitsProcessor.forward
        self.prefill = sgl.brp.SchedulerBatchResultProcessor.process_batch_result_prefill

    def step(self, meta, aux, hidden=None):
        t = aux.shape[0]
        hidden = torch.randn(t, H) if hidden is None else hidden
        return self.logits(None, torch.zeros(t, dtype=torch.long), hidden, None, meta, aux)

    def send(self, reqs, out):
        """The scheduler's result processing of an extend batch on this rank."""
        from sglang.srt.managers.utils import GenerationBatchResult

        self.sgl.monkeypatch.setattr(patch, "_is_writer_rank", lambda: True)
        self.sgl.monkeypatch.setattr(patch, "_source", lambda node=0: self.source)
        batch = types.SimpleNamespace(
            return_hidden_states=True,
            reqs=[types.SimpleNamespace(rid=r) for r, _, _ in reqs],
            prefix_lens=[s for _, s, _ in reqs],
            extend_lens=[n for _, _, n in reqs],
        )
        result = GenerationBatchResult(
            logits_output=out, extend_input_len_per_req=[n for _, _, n in reqs]
        )
        self.prefill(None, batch, result)
        assert out.hidden_states is None  # SGLang's own .tolist() path never sees the rows


def extend_meta(sgl, lens):
    fm = sgl.fbi
    return sgl.lp.LogitsMetadata(
        forward_mode=fm.ForwardMode.EXTEND,
        capture_hidden_mode=fm.CaptureHiddenMode.FULL,
        extend_seq_lens_cpu=list(lens),
    )


@pytest.fixture
def receiver(tmp_path):
    rx = Receiver(f"ipc://{tmp_path}/rows")
    rx.start()
    yield rx
    rx.stop()


def test_pack_rows_of_a_zero_token_forward_is_empty():
    parts = [torch.empty(0, 3 * H, dtype=torch.bfloat16), torch.empty(0, H)]
    buf = pack_rows(parts, 0, H)  # was: cannot reshape tensor of 0 elements into [0, -1, H]
    assert buf.shape == (0, 4 * H + 4)
    rows, flags = unpack_rows(buf, 4, H)
    assert rows.shape == (4, 0, H) and flags.shape == (4, 0)


@pytest.mark.parametrize("aux_as_list", [False, True])  # 0.5.23 packs aux; 0.5.17 a list
def test_idle_forward_passes_through_the_capture_hook_untouched(sgl, tmp_path, aux_as_list):
    # final states asked too: an idle forward skips the model's final norm, so the pre-norm
    # stash is empty, which must not count as a missing final state
    rank = Rank(sgl, f"ipc://{tmp_path}/rows", "dp1-tp1", final=["pre_norm", "post_norm"])
    fm = sgl.fbi
    idle = sgl.lp.LogitsMetadata(
        forward_mode=fm.ForwardMode.IDLE, capture_hidden_mode=fm.CaptureHiddenMode.FULL
    )
    aux = [torch.empty(0, H) for _ in LAYERS] if aux_as_list else torch.empty(0, 2 * H)
    out = rank.logits(None, torch.empty(0, dtype=torch.long), torch.empty(0, H), None, idle, aux)
    if aux_as_list:
        assert out.hidden_states.shape == (0, 2 * H)  # SGLang's own concatenation, unpacked
    else:
        assert out.hidden_states is aux  # the very tensor SGLang returned
    assert out.next_token_logits.shape == (0, 8)

    # the next, real forward of the same process still packs its rows and final states
    x, pre = torch.randn(5, H), torch.randn(5, H)
    patch._stash_pre_norm(None, (x, None), (x, pre))  # the final norm's forward hook
    aux = torch.randn(5, 2 * H)
    out = rank.logits(
        None, torch.zeros(5, dtype=torch.long), x, None, extend_meta(sgl, [2, 3]), aux
    )
    rows, flags = unpack_rows(out.hidden_states, 4, H)
    assert torch.equal(rows[0], aux[:, :H]) and torch.equal(rows[1], aux[:, H:])
    assert torch.equal(rows[2], pre) and torch.equal(rows[3], x)
    assert bool((flags == 1).all()) and not patch._STASH


def test_idle_rank_padded_to_the_others_length_is_not_packed(sgl, tmp_path):
    # DP attention's MAX_LEN padding turns an idle rank into EXTEND with one dummy request of
    # the other ranks' length (ForwardBatch.prepare_mlp_sync_batch); the real mode is kept in
    # _original_forward_mode, and SGLang cuts the output back to 0 rows afterwards
    rank = Rank(sgl, f"ipc://{tmp_path}/rows", "dp1-tp1")
    fm = sgl.fbi
    fb = fm.ForwardBatch(
        forward_mode=fm.ForwardMode.EXTEND,
        batch_size=1,
        input_ids=torch.zeros(8, dtype=torch.long),
        req_pool_indices=torch.zeros(1, dtype=torch.long),
        seq_lens=torch.tensor([8]),
        out_cache_loc=torch.zeros(8, dtype=torch.long),
        seq_lens_sum=8,
        extend_seq_lens_cpu=[8],
        capture_hidden_mode=fm.CaptureHiddenMode.FULL,
        _original_forward_mode=fm.ForwardMode.IDLE,
    )  # fails if SGLang renames it
    aux = torch.randn(8, 2 * H)
    assert rank.step(fb, aux).hidden_states is aux
    fb._original_forward_mode = None  # the same batch as a real extend is packed
    assert rank.step(fb, aux).hidden_states.shape == (8, 2 * H + 2)


def test_each_dp_rank_sends_its_own_requests_once(sgl, tmp_path, receiver):
    endpoint = f"ipc://{tmp_path}/rows"
    r0 = Rank(sgl, endpoint, "dp0-tp0")
    r1 = Rank(sgl, endpoint, "dp1-tp1")
    idle = sgl.lp.LogitsMetadata(
        forward_mode=sgl.fbi.ForwardMode.IDLE, capture_hidden_mode=sgl.fbi.CaptureHiddenMode.FULL
    )
    seq = {"a": torch.randn(5, 2 * H), "b": torch.randn(10, 2 * H), "c": torch.randn(7, 2 * H)}

    # step 1: rank 0 prefills a and the first 4 tokens of b (chunked); rank 1 is idle
    out0 = r0.step(extend_meta(sgl, [5, 4]), torch.cat([seq["a"], seq["b"][:4]]))
    out1 = r1.step(idle, torch.empty(0, 2 * H))
    assert out1.hidden_states.shape == (0, 2 * H)  # untouched; SGLang drops idle results
    r0.send([("a", 0, 5), ("b", 0, 4)], out0)
    # step 2 (mixed): rank 0 finishes b, rank 1 prefills c
    out0 = r0.step(extend_meta(sgl, [6]), seq["b"][4:])
    out1 = r1.step(extend_meta(sgl, [7]), seq["c"])
    r1.send([("c", 0, 7)], out1)
    r0.send([("b", 4, 6)], out0)

    for rid, aux in seq.items():
        rows, bad = receiver.take(rid, aux.shape[0], 10)
        assert bad == []
        assert torch.equal(rows[0], aux[:, :H]) and torch.equal(rows[1], aux[:, H:]), rid
    assert {k: v["rows"] for k, v in receiver.sources.items()} == {"dp0-tp0": 15, "dp1-tp1": 7}
    assert receiver.parts == {} and receiver.error is None


def test_a_request_sent_by_two_processes_fails(sgl, tmp_path, receiver):
    endpoint = f"ipc://{tmp_path}/rows"
    r0, r1 = Rank(sgl, endpoint, "dp0-tp0"), Rank(sgl, endpoint, "dp1-tp1")
    aux = torch.randn(6, 2 * H)
    r0.send([("x", 0, 3)], r0.step(extend_meta(sgl, [3]), aux[:3]))
    r1.send([("x", 3, 3)], r1.step(extend_meta(sgl, [3]), aux[3:]))
    with pytest.raises(CaptureError, match="2 scheduler processes"):
        receiver.take("x", 6, 10)


def test_rows_sent_again_after_the_sample_was_taken_fail_the_run(sgl, tmp_path, receiver):
    endpoint = f"ipc://{tmp_path}/rows"
    r0, r1 = Rank(sgl, endpoint, "dp0-tp0"), Rank(sgl, endpoint, "dp1-tp1")
    aux = torch.randn(4, 2 * H)
    r0.send([("y", 0, 4)], r0.step(extend_meta(sgl, [4]), aux))
    receiver.take("y", 4, 10)
    r1.send([("y", 0, 4)], r1.step(extend_meta(sgl, [4]), aux))  # a second rank repeats y
    r1.send([("z", 0, 4)], r1.step(extend_meta(sgl, [4]), aux))  # (one socket: in order)
    with pytest.raises(
        CaptureError,
        match="after the sample was complete.*first sent by dp0-tp0: two scheduler processes",
    ):
        receiver.take("z", 4, 10)


def test_rows_of_a_discarded_request_are_dropped(receiver, tmp_path):
    from hsdump.capture.rows import Sender

    receiver.discard("gone")  # the caller gave the request up (its task was cancelled)
    s = Sender(f"ipc://{tmp_path}/rows", "dp0-tp0")
    s.rows("gone", 0, torch.randn(2, 3, H), [])
    s.rows("kept", 0, torch.randn(2, 3, H), [])
    rows, _ = receiver.take("kept", 3, 10)
    assert rows[0].shape == (3, H) and "gone" not in receiver.parts and receiver.error is None


@pytest.mark.parametrize(
    "extra, match",
    [
        ({"moe_a2a_backend": "deepep", "ep_size": 2}, "moe_a2a_backend=deepep"),
        ({"enable_two_batch_overlap": True}, "enable_two_batch_overlap"),
        ({"attn_cp_size": 2}, "attn_cp_size=2"),
    ],
)
def test_layouts_hsdump_cannot_capture_are_refused_before_start(extra, match):
    from hsdump.config import EngineConfig, ModelConfig

    cfg = EngineConfig(device="cpu", extra=extra)
    with pytest.raises(ValueError, match=match) as e:
        serving.check_supported(None, cfg, ModelConfig(path="unused", tp_size=2))
    assert "enable_dp_attention=true" in str(e.value)  # names a layout that works


@pytest.mark.parametrize(
    "extra",
    [
        {"dp_size": 2, "enable_dp_attention": True},
        {"ep_size": 2},
        {"ep_size": 2, "moe_a2a_backend": "none"},
        {"dp_size": 2},
    ],
)
def test_verified_layouts_pass_the_layout_check(extra):
    serving.check_layout(extra)
