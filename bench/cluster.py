"""A Redis Cluster from redis-server processes: what the tests and the scale benchmark share.

`command` sends one command over raw RESP (no client is needed while a node starts),
`cluster_info` reads a node's CLUSTER INFO and `cluster_ok` judges it, `replication_up` says
whether a replica's link to its master is up; `ClusterNode` is one node (its address, ports and
directory) and `node_args` its command line. `form` joins started nodes into a cluster without
`redis-cli --cluster create` (which wants at least three masters): every node takes a config
epoch of its own, the first meets the others, the masters take even ranges of the 16384 slots
(ADDSLOTSRANGE) and each replica follows its master (REPLICATE) once it knows it.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

LOOPBACK = "127.0.0.1"
TOTAL_SLOTS = 16384
#: How long `form` waits for gossip (every node knowing every other, a replica its master).
FORM_TIMEOUT_S = 20.0


class ClusterFormError(RuntimeError):
    """A node refused a step of `form`, or gossip did not spread in time."""


def command(port: int, *args: str, host: str = LOOPBACK, timeout: float = 1.0) -> bytes:
    """Send one inline command over raw RESP and return the raw reply (no client needed)."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall((" ".join(args) + "\r\n").encode())
        data = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
            if data.startswith(b"$") and b"\r\n" in data:
                length = int(data[1 : data.index(b"\r\n")])
                if length < 0 or len(data) >= data.index(b"\r\n") + 2 + length + 2:
                    break
            elif data.endswith(b"\r\n"):
                break
        return data


def cluster_info(port: int, host: str = LOOPBACK) -> dict[str, str]:
    """`CLUSTER INFO` of one node as a dict ({} when the node does not answer)."""
    try:
        raw = command(port, "CLUSTER", "INFO", host=host)
    except OSError:
        return {}
    info: dict[str, str] = {}
    for line in raw.decode(errors="replace").splitlines():
        key, sep, value = line.partition(":")
        if sep:
            info[key.strip()] = value.strip()
    return info


def cluster_ok(info: dict[str, str], nodes: int) -> bool:
    """Whether a node's CLUSTER INFO says the cluster is ok: every slot served, and at least
    `nodes` nodes known."""
    return (
        info.get("cluster_state") == "ok"
        and info.get("cluster_slots_assigned") == str(TOTAL_SLOTS)
        and info.get("cluster_slots_ok") == str(TOTAL_SLOTS)
        and int(info.get("cluster_known_nodes", "0")) >= nodes
    )


def replication_up(port: int, host: str = LOOPBACK) -> bool:
    """True for a master, or for a replica whose link to its master is up."""
    try:
        raw = command(port, "INFO", "replication", host=host).decode(errors="replace")
    except OSError:
        return False
    if "role:slave" not in raw:
        return "role:master" in raw
    return "master_link_status:up" in raw


@dataclass
class ClusterNode:
    port: int
    bus_port: int
    directory: Path
    process: subprocess.Popen[bytes] | None = None
    host: str = LOOPBACK

    @property
    def log(self) -> Path:
        return self.directory / "redis.log"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, chars: int = 600) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:].strip() or "(empty log)"
        except OSError:
            return "(no log)"


def node_args(
    binary: str, node: ClusterNode, node_timeout_ms: int, extra: Sequence[str] = ()
) -> list[str]:
    """The command line of one cluster node: bound to its host, nothing persisted."""
    return [
        binary,
        "--port", str(node.port),
        "--bind", node.host,
        "--dir", str(node.directory),
        "--logfile", str(node.log),
        "--cluster-enabled", "yes",
        "--cluster-config-file", "nodes.conf",
        "--cluster-port", str(node.bus_port),
        "--cluster-node-timeout", str(node_timeout_ms),
        "--appendonly", "no",
        # Replicas sync at once instead of after the default 5 s diskless-sync delay.
        "--repl-diskless-sync", "yes",
        "--repl-diskless-sync-delay", "0",
        "--save", "",
        "--daemonize", "no",
        "--protected-mode", "yes",
        *extra,
    ]  # fmt: skip


def slot_ranges(masters: int, hot: Sequence[int] = ()) -> list[tuple[int, int]]:
    """Contiguous slot ranges (first, last) for `masters` masters: even, or, given `hot`
    slots (a deployment's partitions, `Keys.slot`), each holding an equal share of those
    (within one), cut halfway between neighbours. Even ranges put Agon's 16 partitions on
    only 4 of 8 masters: the other four served none of the games' keys."""
    ordered = sorted(set(hot))
    bounds = [TOTAL_SLOTS * i // masters for i in range(masters + 1)]
    if len(ordered) >= masters:
        cuts = (len(ordered) * i // masters for i in range(1, masters))
        bounds[1:-1] = [(ordered[k - 1] + ordered[k] + 1) // 2 for k in cuts]
    return [(bounds[i], bounds[i + 1] - 1) for i in range(masters)]


def _ok(node: ClusterNode, *args: str) -> bytes:
    reply = command(node.port, *args, host=node.host)
    if reply.startswith(b"-"):
        what = " ".join(args[:2])
        raise ClusterFormError(f"{what} on {node.host}:{node.port}: {reply.decode().strip()}")
    return reply


def _until(
    nodes: Sequence[ClusterNode], done: Callable[[], bool], what: str, timeout_s: float
) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise ClusterFormError(f"{what} within {timeout_s:g} s: " + _tails(nodes))
        time.sleep(0.05)


def _tails(nodes: Sequence[ClusterNode]) -> str:
    return "; ".join(f"{n.host}:{n.port}: {n.log_tail(200)}" for n in nodes)


def form(
    masters: Sequence[ClusterNode],
    replicas: Sequence[tuple[ClusterNode, ClusterNode]],
    timeout_s: float = FORM_TIMEOUT_S,
    ranges: Sequence[tuple[int, int]] | None = None,
) -> None:
    """Join started nodes into one cluster: `masters` share the slots (`ranges`, default
    even), and each (replica, master) pair replicates. Returns once every replica has asked
    to follow its master; `cluster_ok` and `replication_up` tell when the cluster is whole."""
    nodes = [*masters, *(replica for replica, _ in replicas)]
    for epoch, node in enumerate(nodes, start=1):
        _ok(node, "CLUSTER", "SET-CONFIG-EPOCH", str(epoch))
    first = nodes[0]
    for node in nodes[1:]:
        _ok(first, "CLUSTER", "MEET", node.host, str(node.port), str(node.bus_port))
    for node, (lo, hi) in zip(masters, ranges or slot_ranges(len(masters)), strict=True):
        _ok(node, "CLUSTER", "ADDSLOTSRANGE", str(lo), str(hi))

    def everyone_known() -> bool:
        known = [cluster_info(n.port, n.host).get("cluster_known_nodes", "0") for n in nodes]
        return all(int(k) >= len(nodes) for k in known)

    _until(nodes, everyone_known, "not every node knew every other", timeout_s)
    for replica, master in replicas:
        master_id = _ok(master, "CLUSTER", "MYID").split(b"\r\n")[1].decode()
        deadline = time.monotonic() + timeout_s
        while True:  # the replica may not have heard of its master's id yet
            reply = command(replica.port, "CLUSTER", "REPLICATE", master_id, host=replica.host)
            if reply.startswith(b"+OK"):
                break
            if time.monotonic() > deadline:
                raise ClusterFormError(
                    f"{replica.host}:{replica.port} would not follow {master.host}:"
                    f"{master.port}: {reply.decode().strip()}"
                )
            time.sleep(0.05)
