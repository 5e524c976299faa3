"""The TCP port a one-node DP-attention engine gets (serving.dp_attention_port).

Under DP attention SGLang derives its TCP ports from `port` alone (port + 13 for the DP
controller's handshake, port + 233 + 0..6 for its sockets), so a
second such engine on one host failed to start (2026-11-30, two H200s: "port_base at 30234 is
not available in 30 seconds"). hsdump picks a `port` whose derived ports are free, unless the
user gave one or the engine spans nodes."""

import socket

import pytest

from hsdump.capture.serving import (
    dp_attention_offsets,
    dp_attention_port,
    engine_kwargs,
    engine_layout,
)
from hsdump.config import EngineConfig, ModelConfig


class InOrder:
    """An rng whose shuffle keeps the candidates in order (30000, 30100, ...)."""

    def shuffle(self, xs):
        pass


def sglang_offsets():
    """The offsets the installed SGLang derives from `port` under DP attention."""
    from sglang.srt.server_args import DP_ATTENTION_HANDSHAKE_PORT_DELTA, ZMQ_TCP_PORT_DELTA

    return [DP_ATTENTION_HANDSHAKE_PORT_DELTA] + [ZMQ_TCP_PORT_DELTA + i for i in range(8)]


def bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_left_alone_without_dp_attention_or_with_a_given_port():
    assert dp_attention_port({"tp_size": 2}) is None
    assert dp_attention_port({"enable_dp_attention": False}) is None
    assert dp_attention_port({"enable_dp_attention": True, "port": 31000}) is None
    assert dp_attention_port({"enable_dp_attention": True, "dist_init_addr": "n1:5000"}) is None
    assert dp_attention_port({"enable_dp_attention": True, "nnodes": 2}) is None


def test_offsets_are_sglangs():
    assert dp_attention_offsets() == sglang_offsets()


@pytest.mark.parametrize("taken", [1, 0])  # port_base (233 + 1), the handshake (13)
def test_skips_a_port_whose_derived_ports_are_taken(taken):
    offsets = sglang_offsets()  # the installed SGLang's: the ones hsdump must check
    first = dp_attention_port({"enable_dp_attention": True}, rng=InOrder())
    assert first is not None and 30000 <= first < 40000 and first % 100 == 0
    assert all(bindable(first + d) for d in offsets)
    with socket.socket() as held:  # what an earlier DP-attention engine leaves bound
        held.bind(("127.0.0.1", first + offsets[taken]))
        held.listen()
        port = dp_attention_port({"enable_dp_attention": True}, rng=InOrder())
        assert port is not None and port > first and port % 100 == 0
        assert all(bindable(port + d) for d in offsets)
    assert dp_attention_port({"enable_dp_attention": True}, rng=InOrder()) == first


def test_engine_kwargs_carry_the_port():
    def kwargs(extra):
        c = EngineConfig(device="cpu", extra=extra)
        return engine_kwargs(
            c, "/m", ModelConfig(path="/m"), "0.5.17", [1, 2], False, None, engine_layout(c)
        )

    assert "port" not in kwargs({})
    got = kwargs({"dp_size": 2, "enable_dp_attention": True})
    assert isinstance(got["port"], int) and 30000 <= got["port"] < 40000
    assert kwargs({"dp_size": 2, "enable_dp_attention": True, "port": 41000})["port"] == 41000
