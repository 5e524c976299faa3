"""Rows between nodes (issue 25): the CURVE-authenticated TCP transport of hsdump.capture.rows and the
multi-node helpers of hsdump.capture.nodes. CPU only, loopback only, no SGLang.

Two processes stand for two nodes' schedulers where it matters (spawned, as SGLang starts
its schedulers). Module-level imports stay light: the spawned children import this module.
"""

import json
import multiprocessing as mp
import os
import signal
import socket
import stat
import threading
import time

import pytest
import zmq

pytestmark = pytest.mark.skipif(not zmq.has("curve"), reason="libzmq without CURVE")

S, H = 3, 16  # slots, hidden size


def chunk(seed: int, n: int, dtype: str = "bfloat16"):
    """A deterministic [S, n, H] chunk, the same in every process."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randn(S, n, H, generator=g).to(getattr(torch, dtype))


def bits(t):
    import torch

    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


def same(a, b) -> bool:
    """Bit-exact equality (NaN rows included)."""
    import torch

    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


@pytest.fixture
def keys():
    from hsdump.capture.rows import new_run_keys

    return new_run_keys()


@pytest.fixture
def tcp_rx(keys):
    from hsdump.capture.rows import Receiver

    rx = Receiver("tcp://127.0.0.1:0", keys=keys)
    rx.start()
    yield rx
    rx.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- rows over TCP
def test_rows_over_curve_tcp_stitch_exactly_like_ipc(tmp_path, keys):
    import torch

    from hsdump.capture.rows import Receiver, Sender

    # request a: three chunks (one of 0 rows), a NaN row in slot 1; request b: float32, whole
    nan = chunk(3, 4)
    nan[1, 2, 5] = float("nan")
    sends = [
        ("a", 0, chunk(1, 5), []),
        ("a", 5, chunk(2, 0), []),
        ("a", 5, nan, [1]),
        ("b", 0, chunk(4, 7, "float32"), []),
    ]
    got = {}
    for kind in ("ipc", "tcp"):
        if kind == "ipc":
            rx = Receiver(f"ipc://{tmp_path}/rows")
            tx = Sender(f"ipc://{tmp_path}/rows", "dp0-tp0")
        else:
            rx = Receiver("tcp://127.0.0.1:0", keys=keys)
            spec = json.loads(json.dumps(rx.sender_spec()))  # travels as JSON in the spec
            assert spec["endpoint"] == rx.endpoint and rx.endpoint.startswith("tcp://127.0.0.1:")
            assert int(rx.endpoint.rsplit(":", 1)[1]) > 0  # port 0: the bound one is exposed
            tx = Sender.from_spec(spec, "n1-dp1-tp2")
        rx.start()
        try:
            for rid, start, rows, bad in sends:
                tx.rows(rid, start, rows, bad)
            got[kind] = {"a": rx.take("a", 9, 10), "b": rx.take("b", 7, 10)}
            assert rx.error is None
        finally:
            tx.close()
            rx.stop()
    want_a = torch.cat([chunk(1, 5), nan], dim=1)
    for kind in ("ipc", "tcp"):
        (a, bad_a), (b, bad_b) = got[kind]["a"], got[kind]["b"]
        assert bad_a == [1] and bad_b == []
        assert all(same(a[s], want_a[s]) for s in range(S))
        assert all(same(b[s], chunk(4, 7, "float32")[s]) for s in range(S))
        assert all(x.is_contiguous() for x in a + b)


def test_tcp_needs_keys_on_both_ends(keys):
    from hsdump.capture.rows import Receiver, Sender

    with pytest.raises(ValueError, match="unauthenticated"):
        Receiver("tcp://127.0.0.1:0")
    with pytest.raises(ValueError, match="lacks server_key, client_public, client_secret"):
        Sender.from_spec({"endpoint": "tcp://127.0.0.1:5"}, "x")
    with pytest.raises(ValueError, match="unauthenticated"):
        Sender("tcp://127.0.0.1:5", "x")
    with pytest.raises(ValueError, match="not a Z85 CURVE key"):
        Sender.from_spec(
            {
                "endpoint": "tcp://127.0.0.1:5",
                "server_key": "short",
                "client_public": keys["client_public"],
                "client_secret": keys["client_secret"],
            },
            "x",
        )


def test_clients_without_this_runs_keys_deliver_nothing(tcp_rx, keys):
    from hsdump.capture.rows import DeliveryError, Receiver, Sender, new_run_keys

    good = tcp_rx.sender_spec()
    other = new_run_keys()
    stale_rx = Receiver("tcp://127.0.0.1:0", keys=other)  # an earlier run's receiver
    stale = stale_rx.sender_spec()
    stale_rx.stop()
    bad_specs = {
        "stale": {
            **good,
            "client_public": stale["client_public"],
            "client_secret": stale["client_secret"],
        },  # a stale run's key file
        "forged": {
            **good,
            "client_public": other["server_public"],
            "client_secret": other["server_secret"],
        },  # a keypair of its own
        "wrong-server": {**good, "server_key": other["server_public"]},
    }
    # a client without keys (plain ZMQ, no CURVE) and a raw TCP client writing junk
    plain = zmq.Context.instance().socket(zmq.PUSH)
    plain.connect(good["endpoint"])
    header = {
        "rid": "evil-plain",
        "start": 0,
        "n": 2,
        "hidden": H,
        "dtype": "float32",
        "nonfinite": [],
        "src": "evil",
    }
    plain.send_multipart([json.dumps(header).encode()] + [b"\0" * (2 * H * 4)] * S)
    host, port = good["endpoint"][len("tcp://") :].rsplit(":", 1)
    junk = socket.create_connection((host, int(port)))
    junk.sendall(b"\xff" + b"\0" * 8 + b"\x7f" + os.urandom(4096))

    reasons = {}
    for name, spec in bad_specs.items():
        tx = Sender.from_spec(spec, f"evil-{name}", send_timeout=0.7)
        t0 = time.monotonic()
        with pytest.raises(DeliveryError) as e:
            tx.rows(f"evil-{name}", 0, chunk(9, 2), [])
        assert time.monotonic() - t0 < 5
        reasons[name] = str(e.value)
        tx.close(linger_s=0)
    assert "refused this sender's CURVE key" in reasons["stale"]
    assert "refused this sender's CURVE key" in reasons["forged"]
    assert "handshake failed" in reasons["wrong-server"]
    assert all(f"evil-{n} on {socket.gethostname()}" in r for n, r in reasons.items())

    # the receiver is not confused: the run's own sender gets through, nothing else did
    tx = Sender.from_spec(good, "n1-dp1-tp2")
    tx.rows("good", 0, chunk(5, 6), [])
    rows, bad = tcp_rx.take("good", 6, 10)
    assert all(same(rows[s], chunk(5, 6)[s]) for s in range(S)) and bad == []
    time.sleep(0.2)
    with tcp_rx.cond:
        assert tcp_rx.error is None and not tcp_rx.parts
        assert set(tcp_rx.sources) == {"n1-dp1-tp2"}
    assert tcp_rx.refused >= 2
    tx.close()
    plain.close(linger=0)
    junk.close()


def test_lost_message_and_error_report_name_the_sender_and_its_node(keys):
    from hsdump.capture.rows import CaptureError, Receiver, Sender

    host = socket.gethostname()
    for what in ("lost", "error"):
        rx = Receiver("tcp://127.0.0.1:0", keys=keys)
        rx.start()
        tx = Sender.from_spec(rx.sender_spec(), "n1-dp1-tp2")
        try:
            tx.rows("r", 0, chunk(1, 2), [])
            if what == "lost":
                tx._seq += 1  # as if a message were lost on a broken connection
                tx.rows("r", 2, chunk(2, 2), [])
                match = rf"n1-dp1-tp2 on {host}: 1 row message\(s\) .* lost in transit"
            else:
                tx.error("captured rows have shape (3, 4)")
                match = rf"n1-dp1-tp2 on {host}: captured rows have shape \(3, 4\)"
            with pytest.raises(CaptureError, match=match):
                rx.take("r", 4, 10)
        finally:
            tx.close()
            rx.stop()


# --------------------------------------------------------------------------- two nodes
def _node1_scheduler(spec, cmds, done):
    """Node 1's row-owning scheduler: sends what the test asks, over CURVE TCP."""
    from hsdump.capture.rows import Sender

    tx = Sender.from_spec(spec, "n1-dp1-tp2", send_timeout=10)
    for rid, start, n, seed in iter(cmds.get, None):
        tx.rows(rid, start, chunk(seed, n), [])
        done.put(rid)
    tx.close()


def test_two_nodes_one_source_per_request_no_overlap_no_repeat(tcp_rx):
    import torch

    from hsdump.capture.rows import CaptureError, Sender

    ctx = mp.get_context("spawn")
    cmds, done = ctx.Queue(), ctx.Queue()
    node1 = ctx.Process(target=_node1_scheduler, args=(tcp_rx.sender_spec(), cmds, done))
    node1.start()
    node0 = Sender.from_spec(tcp_rx.sender_spec(), "n0-dp0-tp0")

    def on_node1(rid, start, n, seed):
        cmds.put((rid, start, n, seed))
        assert done.get(timeout=60) == rid

    try:
        # each node sends its own requests, node 1's in two chunks: both stitch exactly
        node0.rows("a", 0, chunk(1, 4), [])
        on_node1("b", 0, 3, 2)
        on_node1("b", 3, 2, 3)
        a, _ = tcp_rx.take("a", 4, 30)
        b, _ = tcp_rx.take("b", 5, 30)
        want_b = torch.cat([chunk(2, 3), chunk(3, 2)], dim=1)
        assert all(same(a[s], chunk(1, 4)[s]) and same(b[s], want_b[s]) for s in range(S))
        with tcp_rx.cond:
            assert {k: v["rows"] for k, v in tcp_rx.sources.items()} == {
                "n0-dp0-tp0": 4,
                "n1-dp1-tp2": 5,
            }

        # one request's chunks from both nodes
        node0.rows("c", 0, chunk(4, 2), [])
        on_node1("c", 2, 2, 5)
        with pytest.raises(
            CaptureError,
            match="rows came from 2 scheduler processes "
            r"\(n0-dp0-tp0, n1-dp1-tp2\)",
        ):
            tcp_rx.take("c", 4, 30)

        # overlapping chunks from node 1
        on_node1("d", 0, 4, 6)
        on_node1("d", 2, 4, 7)
        with pytest.raises(CaptureError, match="rows from 2 arrived where 4 was expected"):
            tcp_rx.take("d", 6, 30)

        # a repeat: node 1's request, complete, sent again by node 0 (sticky: last)
        on_node1("e", 0, 3, 8)
        tcp_rx.take("e", 3, 30)
        node0.rows("e", 0, chunk(8, 3), [])
        node0.rows("f", 0, chunk(9, 1), [])  # one socket: in order, after the repeat
        with pytest.raises(
            CaptureError,
            match=rf"arrived from n0-dp0-tp0 on "
            rf"{socket.gethostname()} after the sample was "
            "complete; they were first sent by n1-dp1-tp2",
        ):
            tcp_rx.take("f", 1, 30)
    finally:
        cmds.put(None)
        node1.join(30)
        if node1.is_alive():
            node1.kill()
        node0.close(linger_s=0)
    assert node1.exitcode == 0


# --------------------------------------------------------------------------- delivery bounds
def _bare_receiver(keys, q):
    """A CURVE PULL that takes rows (no torch: starts fast), to be frozen and killed."""
    ctx = zmq.Context()
    s = ctx.socket(zmq.PULL)
    s.curve_server = True
    s.curve_publickey = keys["server_public"].encode()
    s.curve_secretkey = keys["server_secret"].encode()
    s.bind("tcp://127.0.0.1:0")
    q.put(s.getsockopt_string(zmq.LAST_ENDPOINT))
    while True:
        s.recv_multipart()


def test_sender_raises_within_its_bound_when_the_receiver_freezes_or_dies(keys):
    from hsdump.capture.rows import DeliveryError, Sender

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    node0 = ctx.Process(target=_bare_receiver, args=(keys, q), daemon=True)
    node0.start()
    try:
        endpoint = q.get(timeout=30)
        spec = {
            "endpoint": endpoint,
            "server_key": keys["server_public"],
            "client_public": keys["client_public"],
            "client_secret": keys["client_secret"],
        }
        tx = Sender.from_spec(spec, "n1-dp1-tp2", send_timeout=1.0, hwm=2)
        big = chunk(1, 2**16, "float32")  # 3 x 4 MB frames
        tx.rows("r", 0, big, [])
        os.kill(node0.pid, signal.SIGSTOP)  # frozen: the queue and the socket buffers fill
        t0 = time.monotonic()
        with pytest.raises(
            DeliveryError, match="within 1 s: the receiver is connected but took no rows"
        ):
            for i in range(1, 64):
                tx.rows("r", i, big, [])
        assert time.monotonic() - t0 < 10
        node0.kill()  # dies: the connection goes, the next send raises too
        node0.join(10)
        t0 = time.monotonic()
        with pytest.raises(DeliveryError, match="the receiver went away"):
            for i in range(64):
                tx.rows("s", i, chunk(2, 1), [])
                time.sleep(0.05)
        assert time.monotonic() - t0 < 5
        tx.close(linger_s=0)
    finally:
        if node0.is_alive():
            os.kill(node0.pid, signal.SIGCONT)
            node0.kill()
            node0.join(10)


def test_sender_raises_when_the_receiver_stopped_or_never_ran(keys):
    from hsdump.capture.rows import DeliveryError, Receiver, Sender

    rx = Receiver("tcp://127.0.0.1:0", keys=keys)
    rx.start()
    tx = Sender.from_spec(rx.sender_spec(), "n1-dp1-tp2", send_timeout=0.5)
    tx.rows("r", 0, chunk(1, 2), [])
    rx.take("r", 2, 10)
    rx.stop()
    t0 = time.monotonic()
    with pytest.raises(
        DeliveryError,
        match="n1-dp1-tp2 on .*: rows .* of request s could not be delivered .* within 0.5 s",
    ):
        for i in range(64):
            tx.rows("s", i, chunk(2, 1), [])
            time.sleep(0.05)
    assert time.monotonic() - t0 < 5
    tx.close(linger_s=0)

    nobody = {**rx.sender_spec(), "endpoint": f"tcp://127.0.0.1:{free_port()}"}
    tx = Sender.from_spec(nobody, "n1-dp1-tp2", send_timeout=0.5)
    t0 = time.monotonic()
    with pytest.raises(DeliveryError, match="no connection could be made"):
        tx.rows("r", 0, chunk(1, 2), [])
    with pytest.raises(DeliveryError, match="the error report"):
        tx.error("something failed")  # the report cannot get through either: it raises
    assert time.monotonic() - t0 < 3
    tx.close(linger_s=0)


# --------------------------------------------------------------------------- key handover
def test_run_keys_file_round_trip_is_private_and_atomic(tmp_path, tcp_rx):
    from hsdump.capture.nodes import read_run_keys, remove_run_keys, write_run_keys
    from hsdump.capture.rows import Sender

    path = write_run_keys(tmp_path / "keys.json", tcp_rx.sender_spec(), run="slurm-7.0-r0")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert os.listdir(tmp_path) == ["keys.json"]  # no temporary file left
    spec = read_run_keys(path, timeout=1, run="slurm-7.0-r0")
    assert spec == tcp_rx.sender_spec() and "server_secret" not in path.read_text()
    tx = Sender.from_spec(spec, "n1-dp1-tp2")  # what node 1 does with it
    tx.rows("r", 0, chunk(1, 2), [])
    tcp_rx.take("r", 2, 10)
    tx.close()
    remove_run_keys(path)
    remove_run_keys(path)
    assert not path.exists()
    with pytest.raises(ValueError, match="lacks server_key"):
        write_run_keys(tmp_path / "k2", {"endpoint": "ipc:///tmp/x"})


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620, 0o644])
def test_run_keys_readable_by_others_are_refused(tmp_path, keys, mode):
    from hsdump.capture.nodes import read_run_keys, write_run_keys

    spec = {
        "endpoint": "tcp://127.0.0.1:5",
        "server_key": keys["server_public"],
        "client_public": keys["client_public"],
        "client_secret": keys["client_secret"],
    }
    path = write_run_keys(tmp_path / "keys.json", spec)
    os.chmod(path, mode)
    with pytest.raises(
        PermissionError,
        match=f"mode {mode:04o}: run keys readable or writable by group or others are refused",
    ):
        read_run_keys(path, timeout=5)


def test_run_keys_of_another_user_or_behind_a_link_are_refused(tmp_path, keys, monkeypatch):
    from hsdump.capture.nodes import read_run_keys, write_run_keys

    spec = {
        "endpoint": "tcp://127.0.0.1:5",
        "server_key": keys["server_public"],
        "client_public": keys["client_public"],
        "client_secret": keys["client_secret"],
    }
    path = write_run_keys(tmp_path / "keys.json", spec)
    (tmp_path / "link.json").symlink_to(path)
    with pytest.raises(PermissionError, match="symbolic link"):
        read_run_keys(tmp_path / "link.json", timeout=1)
    uid = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: uid + 1)
    with pytest.raises(PermissionError, match=f"belongs to uid {uid}, not to this user"):
        read_run_keys(path, timeout=1)


def test_read_run_keys_waits_past_a_stale_file_for_this_launchs(tmp_path, keys):
    from hsdump.capture.nodes import read_run_keys, write_run_keys

    spec = {
        "endpoint": "tcp://127.0.0.1:5",
        "server_key": keys["server_public"],
        "client_public": keys["client_public"],
        "client_secret": keys["client_secret"],
    }
    path = tmp_path / "keys.json"
    with pytest.raises(TimeoutError, match="none was written"):
        read_run_keys(path, timeout=0.2)
    write_run_keys(path, {**spec, "endpoint": "tcp://127.0.0.1:4"}, run="slurm-1.0-r0")
    with pytest.raises(TimeoutError, match=r"another launch \(run slurm-1.0-r0\)"):
        read_run_keys(path, timeout=0.3, run="slurm-2.0-r0")
    later = threading.Timer(0.3, write_run_keys, (path, spec), {"run": "slurm-2.0-r0"})
    later.start()
    t0 = time.monotonic()
    assert read_run_keys(path, timeout=10, run="slurm-2.0-r0", poll=0.05) == spec
    assert 0.2 < time.monotonic() - t0 < 5
    later.join()
    # no launch id: a file written before this launch started is another launch's
    with pytest.raises(TimeoutError, match=r"another launch \(written "):
        read_run_keys(path, timeout=0.2, not_before=time.time() + 60)
    assert read_run_keys(path, timeout=1, not_before=time.time() - 60) == spec


# --------------------------------------------------------------------------- node layout
@pytest.mark.parametrize(
    "nodelist, hosts",
    [
        ("gpu[01-02,05]", ["gpu01", "gpu02", "gpu05"]),
        ("a1,b2", ["a1", "b2"]),
        ("node-[3-4]", ["node-3", "node-4"]),
        ("h[8-11]", ["h8", "h9", "h10", "h11"]),
        ("gpu[09-10],cpu7", ["gpu09", "gpu10", "cpu7"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("single", ["single"]),
    ],
)
def test_slurm_nodelist_expands(nodelist, hosts):
    from hsdump.capture.nodes import expand_nodelist

    assert expand_nodelist(nodelist) == hosts


@pytest.mark.parametrize("bad", ["gpu[01-02", "gpu]1[", "gpu[a-b]", "gpu[5-3]", ""])
def test_slurm_nodelist_unreadable_is_an_error(bad):
    from hsdump.capture.nodes import expand_nodelist

    with pytest.raises(ValueError):
        expand_nodelist(bad)


SLURM = {
    "SLURM_JOB_ID": "4242",
    "SLURM_NNODES": "2",
    "SLURM_NODEID": "1",
    "SLURM_JOB_NODELIST": "gpu[07-08]",
}


def test_layout_from_slurm_explicit_or_single(monkeypatch):
    from hsdump.capture import nodes

    monkeypatch.setattr(nodes.shutil, "which", lambda name: None)  # no scontrol: parsed
    lay = nodes.find_layout(env=SLURM)
    assert (lay.nnodes, lay.node_rank, lay.origin) == (2, 1, "slurm") and not lay.is_head
    host, port = nodes.split_addr(lay.dist_init_addr)
    assert host == "gpu07" and 20000 <= port < 40000
    assert nodes.find_layout(env=SLURM, port=6000).dist_init_addr == "gpu07:6000"
    assert nodes.find_layout(2, 1, "10.0.0.1:7000", env=SLURM).dist_init_addr == "10.0.0.1:7000"
    assert nodes.find_layout(env={}) == nodes.NodeLayout(1, 0, None, "single")
    assert nodes.find_layout(2, 0, "[fd00::1]:7000", env={}) == nodes.NodeLayout(
        2, 0, "[fd00::1]:7000", "explicit"
    )
    assert nodes.split_addr("[fd00::1]:7000") == ("fd00::1", 7000)
    assert nodes.run_id(SLURM) == "slurm-4242.x-r0" and nodes.run_id({}) is None


def test_layout_uses_scontrol_when_on_path(tmp_path, monkeypatch):
    from hsdump.capture import nodes

    fake = tmp_path / "scontrol"
    fake.write_text("#!/bin/sh\necho fromscontrol1\necho fromscontrol2\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert nodes.find_layout(env=SLURM, port=6000).dist_init_addr == "fromscontrol1:6000"


@pytest.mark.parametrize(
    "kw, env, match",
    [
        ({"nnodes": 2, "node_rank": 2, "dist_init_addr": "h:1"}, {}, r"node_rank=2 with nnodes=2"),
        ({"nnodes": 2, "node_rank": 1}, {}, "nnodes=2 needs dist_init_addr"),
        ({"nnodes": 0}, {}, "at least one node"),
        ({"nnodes": 2, "node_rank": -1, "dist_init_addr": "h:1"}, {}, "must be in 0..1"),
        ({"nnodes": 2, "dist_init_addr": "h"}, {}, "is not host:port"),
        ({"nnodes": 2, "dist_init_addr": "h:70000"}, {}, "not in 1..65535"),
        ({"nnodes": 4}, SLURM, "nnodes=4 was given, but this SLURM step says 2"),
        ({"node_rank": 0}, SLURM, "node_rank=0 was given, but this SLURM step says 1"),
        ({}, {**SLURM, "SLURM_STEP_NUM_TASKS": "16"}, "one process per node"),
        ({}, {**SLURM, "SLURM_JOB_NODELIST": "gpu[01-02,05]"}, "names 3 host"),
        ({}, {**SLURM, "SLURM_NODEID": "2"}, "node_rank=2 with nnodes=2"),
    ],
)
def test_layout_inconsistent_values_are_errors(kw, env, match, monkeypatch):
    from hsdump.capture import nodes

    monkeypatch.setattr(nodes.shutil, "which", lambda name: None)
    with pytest.raises(ValueError, match=match):
        nodes.find_layout(env=env, **kw)


def test_node_address_and_receiver_endpoint():
    from hsdump.capture import nodes

    assert nodes.node_address("127.0.0.1:5000") == "127.0.0.1"
    assert nodes.node_address("127.0.0.1") == "127.0.0.1"
    assert nodes.tcp_endpoint("10.0.0.1") == "tcp://10.0.0.1:0"
    assert nodes.tcp_endpoint("fd00::1", 5) == "tcp://[fd00::1]:5"
    # dist_init_addr on the loopback: every node on this host (a simulated multi-node run)
    assert (
        nodes.receiver_endpoint(nodes.NodeLayout(2, 0, "127.0.0.1:5000", "explicit"))
        == "tcp://127.0.0.1:0"
    )


def test_receiver_endpoint_refuses_a_host_name_that_leads_to_loopback(monkeypatch):
    # node0 is named in dist_init_addr, but /etc/hosts maps this host's name to 127.0.1.1:
    # the other nodes could not reach a receiver bound there
    from hsdump.capture import nodes

    monkeypatch.setattr(nodes, "node_address", lambda toward: "127.0.1.1")
    with pytest.raises(ValueError, match="loopback address 127.0.1.1"):
        nodes.receiver_endpoint(nodes.NodeLayout(2, 0, "node0:5000", "explicit"))


def test_sender_spec_names_the_address_senders_connect_to(keys):
    from hsdump.capture.rows import Receiver

    rx = Receiver("tcp://127.0.0.1:0", keys=keys)  # (a bind to 0.0.0.0 must name it)
    try:
        port = rx.endpoint.rsplit(":", 1)[1]
        assert rx.sender_spec("127.0.0.2")["endpoint"] == f"tcp://127.0.0.2:{port}"
        assert rx.sender_spec("::1")["endpoint"] == f"tcp://[::1]:{port}"
    finally:
        rx.stop()
