"""One engine across nodes: where this node stands, and the run's row keys handed over
(no sglang import; pure functions but for the key file and `scontrol`).

For a model too big for one node SGLang runs one engine over `nnodes` nodes
(`nnodes`, `node_rank`, `dist_init_addr=host:port`). Node 0 runs hsdump's pipeline and the
row receiver; the other nodes run SGLang's schedulers only, and those that own rows send them
to node 0 over TCP, CURVE-authenticated (hsdump.capture.rows).

- `find_layout` reads (nnodes, node_rank, dist_init_addr) from explicit values and/or SLURM
  (`srun --ntasks-per-node=1` running the same command line on every node).
- `node_address` is this node's routable IP toward a host (the address node 0 binds its row
  receiver on: `rows.Receiver(tcp_endpoint(node_address(dist_init_addr)), keys)`).
- `write_run_keys` / `read_run_keys` hand the senders' half of the run's keys
  (`Receiver.sender_spec()`: endpoint, server public key, client keypair) from node 0 to the
  others through a file both see (the output folder on a shared file system).

The spec holds the run's client secret: it may travel only over the channel that starts the
run (the scheduler spec's env var on node 0, this 0600 file, owned by the user, for nodes
started by SLURM or Ray with the same command line), never in logs, configs saved with the
output, or command lines. The keys are fresh for every run, so a key file left by an earlier
run opens nothing: its keys are refused by this run's receiver (and `read_run_keys` given a
run id ignores it).
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Tuple

from hsdump.errors import Refusal

KEY_FILE = "hsdump-run-keys.json"  # in the run's output folder
_SPEC_KEYS = ("endpoint", "server_key", "client_public", "client_secret")


# --------------------------------------------------------------------------- layout
@dataclass(frozen=True)
class NodeLayout:
    nnodes: int
    node_rank: int
    dist_init_addr: Optional[str]  # host:port of node 0 (SGLang's dist_init_addr)
    origin: str  # "explicit", "slurm" or "single"

    @property
    def multi(self) -> bool:
        return self.nnodes > 1

    @property
    def is_head(self) -> bool:
        """Node 0: the node that runs hsdump's pipeline and the row receiver."""
        return self.node_rank == 0


def split_addr(addr: str) -> Tuple[str, int]:
    """ "host:port" or "[v6]:port" -> (host, port); ValueError if it is not one."""
    m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:(\d+)|([^:\[\]\s]+):(\d+)", str(addr).strip())
    if not m:
        raise Refusal(f"dist_init_addr {addr!r} is not host:port (or [IPv6]:port)")
    host, port = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
    if not 0 < int(port) < 65536:
        raise Refusal(f"dist_init_addr {addr!r}: port {port} is not in 1..65535")
    return host, int(port)


def expand_nodelist(nodelist: str) -> List[str]:
    """A SLURM hostlist ("gpu[01-02,05]", "a1,b2", "node-[3-4]", "r[1-2]n[1-2]") -> host
    names in order, zero padding kept."""
    hosts: List[str] = []
    for item in _split_top(nodelist.strip()):
        names = [""]
        for text, rng in re.findall(r"([^\[\]]*)(?:\[([^\]]*)\])?", item):
            if not text and not rng:
                continue
            names = [n + text for n in names]
            if rng:
                names = [n + v for n in names for v in _expand_range(rng, nodelist)]
        hosts.extend(names)
    if not hosts or any(not h for h in hosts):
        raise Refusal(f"cannot read the SLURM node list {nodelist!r}")
    return hosts


def _split_top(s: str) -> List[str]:
    """Split at the commas outside brackets."""
    out, depth, cur = [], 0, ""
    for c in s:
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
            if depth < 0:
                raise Refusal(f"unbalanced brackets in the SLURM node list {s!r}")
        if c == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += c
    if depth:
        raise Refusal(f"unbalanced brackets in the SLURM node list {s!r}")
    return [x for x in out + [cur] if x]


def _expand_range(rng: str, whole: str) -> List[str]:
    vals = []
    for part in rng.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part.strip())
        if not m:
            raise Refusal(f"cannot read {part!r} in the SLURM node list {whole!r}")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo):
            raise Refusal(f"descending range {part!r} in the SLURM node list {whole!r}")
        width = len(lo) if lo.startswith("0") or len(lo) == len(hi) else 0
        vals.extend(str(i).zfill(width) for i in range(int(lo), int(hi) + 1))
    return vals


def slurm_hosts(nodelist: str) -> List[str]:
    """The node list's host names: `scontrol show hostnames` where it is on PATH (SLURM's own
    reading), else `expand_nodelist`."""
    if shutil.which("scontrol"):
        try:
            out = subprocess.run(
                ["scontrol", "show", "hostnames", nodelist],
                check=True,
                capture_output=True,
                text=True,
                timeout=30,
            ).stdout.split()
            if out:
                return out
        except (OSError, subprocess.SubprocessError):
            pass
    return expand_nodelist(nodelist)


def _int(value, what: str) -> int:
    try:
        return int(str(value).strip())
    except ValueError:
        raise Refusal(f"{what} is {value!r}, not an integer") from None


def find_layout(
    nnodes: Optional[int] = None,
    node_rank: Optional[int] = None,
    dist_init_addr: Optional[str] = None,
    port: Optional[int] = None,
    env: Optional[Mapping[str, str]] = None,
) -> NodeLayout:
    """(nnodes, node_rank, dist_init_addr) of this process's node.

    Explicit values (hsdump's config) first; what they leave unset comes from SLURM, when this
    runs in a SLURM step (`srun --ntasks-per-node=1 ...`): the step's node count and node
    id, and node 0's host (first of the node list) with `port` (default: derived from the job
    id, so two jobs sharing a node do not collide) as dist_init_addr. An explicit value that
    contradicts SLURM's is an error. Neither: one node. ValueError for what cannot run:
    node_rank outside 0..nnodes-1, several nodes without an address, several tasks per node.
    """
    env = os.environ if env is None else env
    origin = (
        "explicit" if nnodes is not None or node_rank is not None or dist_init_addr else "single"
    )
    s_nodes = (
        env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_NNODES") or env.get("SLURM_JOB_NUM_NODES")
    )
    if env.get("SLURM_JOB_ID") and s_nodes is not None and env.get("SLURM_NODEID") is not None:
        s_nnodes = _int(s_nodes, "SLURM_NNODES")
        s_rank = _int(env["SLURM_NODEID"], "SLURM_NODEID")
        for what, mine, theirs in (("nnodes", nnodes, s_nnodes), ("node_rank", node_rank, s_rank)):
            if mine is not None and int(mine) != theirs:
                raise Refusal(
                    f"{what}={mine} was given, but this SLURM step says "
                    f"{theirs}: drop the setting or match the allocation"
                )
        tasks = env.get("SLURM_STEP_NUM_TASKS")
        if tasks is not None and _int(tasks, "SLURM_STEP_NUM_TASKS") > s_nnodes:
            raise Refusal(
                f"this SLURM step runs {tasks} tasks on {s_nnodes} node(s): hsdump "
                "runs one process per node (srun --ntasks-per-node=1)"
            )
        nnodes, node_rank = s_nnodes, s_rank
        origin = "slurm"
        if dist_init_addr is None and s_nnodes > 1:
            nodelist = (
                env.get("SLURM_STEP_NODELIST")
                or env.get("SLURM_NODELIST")
                or env.get("SLURM_JOB_NODELIST")
            )
            if not nodelist:
                raise Refusal(
                    "SLURM gives no node list (SLURM_JOB_NODELIST): set "
                    "dist_init_addr=host:port of node 0"
                )
            hosts = slurm_hosts(nodelist)
            if len(hosts) != s_nnodes:
                raise Refusal(
                    f"the SLURM node list {nodelist!r} names {len(hosts)} host(s) "
                    f"for {s_nnodes} node(s)"
                )
            if port is None:
                job = _int(env["SLURM_JOB_ID"].split("_")[0], "SLURM_JOB_ID")
                port = 20000 + (job % 2000) * 10  # SGLang takes ports above it too
            dist_init_addr = f"{hosts[0]}:{int(port)}"
    nnodes = 1 if nnodes is None else _int(nnodes, "nnodes")
    node_rank = 0 if node_rank is None else _int(node_rank, "node_rank")
    if nnodes < 1:
        raise Refusal(f"nnodes={nnodes}: an engine needs at least one node")
    if not 0 <= node_rank < nnodes:
        raise Refusal(
            f"node_rank={node_rank} with nnodes={nnodes}: the rank must be in 0..{nnodes - 1}"
        )
    if nnodes > 1 and not dist_init_addr:
        raise Refusal(
            f"nnodes={nnodes} needs dist_init_addr=host:port (node 0's address, "
            "the same on every node)"
        )
    if dist_init_addr:
        split_addr(dist_init_addr)
    return NodeLayout(nnodes, node_rank, dist_init_addr or None, origin)


# --------------------------------------------------------------------------- addresses
def node_address(toward: str) -> str:
    """This node's IP on the route to `toward` ("host:port" or a host): the address another
    node reaches it at. A UDP connect picks the route; no packet is sent."""
    try:
        host, port = split_addr(toward)
    except ValueError:
        host, port = toward.strip("[]"), 9
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except socket.gaierror as e:
        raise Refusal(f"cannot resolve {host!r}: {e}") from None
    err: Optional[OSError] = None
    for family, kind, proto, _, addr in infos:
        with socket.socket(family, kind, proto) as s:
            try:
                s.connect(addr)
                return s.getsockname()[0]
            except OSError as e:
                err = e
    raise Refusal(f"no route from this node to {host!r}: {err}")


def tcp_endpoint(ip: str, port: int = 0) -> str:
    """ZMQ's tcp endpoint for an IP (IPv6 in brackets); port 0: any free port at bind."""
    return f"tcp://[{ip}]:{port}" if ":" in ip else f"tcp://{ip}:{port}"


def receiver_endpoint(layout: NodeLayout) -> str:
    """Where node 0 binds its row receiver: its address toward dist_init_addr's host (node 0
    itself), any free port. ValueError if that is a loopback address (a host name that maps
    to 127.0.1.1 in /etc/hosts), which the other nodes cannot reach."""
    if not layout.dist_init_addr:
        raise Refusal("one node: the row receiver stays on ipc://")
    ip = node_address(layout.dist_init_addr)
    host = split_addr(layout.dist_init_addr)[0]
    same_host = _is_loopback(host)  # every "node" on this host: a simulated multi-node run
    if ipaddress.ip_address(ip).is_loopback and not same_host:
        raise Refusal(
            f"dist_init_addr {layout.dist_init_addr} leads to the loopback "
            f"address {ip} on node 0: the other nodes cannot reach it; use an "
            "address of node 0 on the network between the nodes"
        )
    return tcp_endpoint(ip)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def run_id(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """An id both nodes of one launch share and the next launch does not: SLURM's job, step
    and restart count; None outside SLURM."""
    env = os.environ if env is None else env
    if not env.get("SLURM_JOB_ID"):
        return None
    return "slurm-{}.{}-r{}".format(
        env["SLURM_JOB_ID"], env.get("SLURM_STEP_ID", "x"), env.get("SLURM_RESTART_COUNT", "0")
    )


# --------------------------------------------------------------------------- key handover
def write_run_keys(path, spec: Dict[str, str], run: Optional[str] = None) -> Path:
    """Node 0: write the senders' spec (`Receiver.sender_spec()`) to `path` (a file of the run's
    output folder on a shared file system), mode 0600, atomically (a reader never sees half a
    file). `run`: the launch's id (`run_id()`), checked by `read_run_keys`. Remove the file
    when the run ends (`remove_run_keys`)."""
    missing = [k for k in _SPEC_KEYS if not spec.get(k)]
    if missing:
        raise Refusal(
            f"the row spec lacks {', '.join(missing)}: only a TCP receiver's "
            "sender_spec() is handed to other nodes"
        )
    path = Path(path)
    body = json.dumps(
        {"version": 1, "run": run, "written": time.time(), **{k: spec[k] for k in _SPEC_KEYS}}
    ).encode()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, body)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)
    try:
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass
    return path


def _load_keys(path: Path) -> dict:
    """The key file, if it is safe: a regular file of this user's, readable by nobody else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as e:
        if os.path.islink(path):
            raise PermissionError(
                f"{path} is a symbolic link: hsdump reads run keys only from a regular file"
            ) from None
        raise e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise PermissionError(f"{path} is not a regular file")
        if st.st_uid != os.getuid():
            raise PermissionError(
                f"{path} belongs to uid {st.st_uid}, not to this user "
                f"(uid {os.getuid()}): its keys are not trusted"
            )
        if st.st_mode & 0o077:
            raise PermissionError(
                f"{path} has mode {stat.S_IMODE(st.st_mode):04o}: run keys "
                "readable or writable by group or others are refused "
                "(hsdump writes them 0600)"
            )
        with os.fdopen(fd, "rb") as f:
            fd = -1
            raw = f.read()
    finally:
        if fd >= 0:
            os.close(fd)
    try:
        data = json.loads(raw)
    except ValueError as e:
        raise Refusal(f"{path} is not a run key file: {e}") from None
    missing = [k for k in _SPEC_KEYS if not isinstance(data, dict) or not data.get(k)]
    if missing:
        raise Refusal(f"{path} is not a run key file: no {', '.join(missing)}")
    return data


def read_run_keys(
    path,
    timeout: float,
    run: Optional[str] = None,
    not_before: Optional[float] = None,
    poll: float = 0.2,
) -> Dict[str, str]:
    """Nodes 1..: wait up to `timeout` s for node 0's key file and return the senders' spec
    (`rows.Sender.from_spec`). A file of another launch is waited past, as if absent: its
    `run` differs from `run` (`run_id()`), or it was written before `not_before` (a time.time()
    on node 0's clock: where no launch id exists, this node's start time less the clocks'
    possible skew). PermissionError for a file that is not this user's or that group/others
    may read; TimeoutError naming what was found if none came. (A stale file read anyway
    opens nothing: its keys are refused, and the sender raises DeliveryError.)"""
    path = Path(path)
    deadline = time.monotonic() + timeout
    found = None
    while True:
        try:
            data = _load_keys(path)
        except FileNotFoundError:
            data = None
        if data is not None:
            written = data.get("written")
            fresh = not_before is None or (
                isinstance(written, (int, float)) and written >= not_before
            )
            if fresh and (run is None or data.get("run") == run):
                return {k: data[k] for k in _SPEC_KEYS}
            found = (
                f"run {data.get('run')}"
                if fresh
                else f"written {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(written))}"
                if isinstance(written, (int, float))
                else "written at an unknown time"
            )
        if time.monotonic() >= deadline:
            what = (
                f"only the keys of another launch ({found}) were there"
                if found
                else "none was written"
            )
            raise TimeoutError(
                f"waited {timeout:g} s for node 0's run keys at {path}"
                f"{' for run ' + run if run else ''}: {what} (is node 0 "
                "running, with the same output folder on a shared file system?)"
            )
        time.sleep(poll)


def remove_run_keys(path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
