"""A real Redis Cluster for the tests: N masters (and R replicas each) on free loopback ports.

`RedisClusterProcesses` starts one `redis-server --cluster-enabled yes` per node, each in a temp
directory of its own, joins them with `redis-cli --cluster create`, and waits until every node
reports `cluster_state:ok` with all 16384 slots assigned. Like `EmbeddedRedis`, it never outlives
its owner: `stop()` is registered with `atexit`, and on Linux every node gets SIGTERM when the
parent dies. `kill(port)` SIGKILLs one node (the crash half of a failover test).
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.cluster import ClusterNode, cluster_ok, node_args, replication_up
from bench.cluster import cluster_info as _cluster_info
from bench.cluster import command as _command
from services.bus.embedded import (
    RedisServerError,
    Server,
    _die_with_parent,
    find_redis_server,
    free_port,
)

#: How long the whole cluster may take to answer `cluster_state:ok` everywhere.
CLUSTER_READY_TIMEOUT_S = 20.0
#: How long one node may take to answer PING after it is spawned.
NODE_START_TIMEOUT_S = 10.0
#: Bind races (another process takes a free port first) are retried on new ports.
START_ATTEMPTS = 3


class RedisClusterError(RedisServerError):
    """The cluster could not be started or did not become healthy in time."""


@dataclass(frozen=True)
class ClusterTarget:
    """What the `cluster_url` fixture gives a test: the cluster and a key prefix of its own.

    A cluster has only database 0, so tests are kept apart by prefix instead of by database.
    """

    url: str
    prefix: str


class RedisClusterProcesses(Server):
    """A Redis Cluster of `masters` primaries and `replicas` replicas per primary.

    Use as a context manager or call start()/stop(). `url` names the first master; a cluster
    client discovers the rest from it. `ports` lists every node (masters first, in the order
    given to `redis-cli --cluster create`, which makes the first `masters` of them primaries).
    """

    def __init__(
        self,
        masters: int = 3,
        replicas: int = 0,
        *,
        binary: str | None = None,
        node_timeout_ms: int = 2000,
        ready_timeout_s: float = CLUSTER_READY_TIMEOUT_S,
        options: Sequence[str] = (),
    ) -> None:
        if masters < 3:
            raise ValueError("redis-cli --cluster create needs at least 3 masters")
        if replicas < 0:
            raise ValueError("replicas must be >= 0")
        self.binary = binary or find_redis_server()
        cli = shutil.which("redis-cli", path=str(Path(self.binary).parent)) or shutil.which(
            "redis-cli"
        )
        if cli is None:
            raise RedisClusterError("redis-cli not found (needed for `--cluster create`)")
        self.cli = cli
        self.masters = masters
        self.replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        #: more redis-server options for every node
        self.options = tuple(options)
        self.ready_timeout_s = ready_timeout_s
        self.nodes: list[ClusterNode] = []
        self._registered = False

    # -- public API -----------------------------------------------------------------------

    @property
    def ports(self) -> list[int]:
        return [node.port for node in self.nodes]

    @property
    def master_ports(self) -> list[int]:
        """Ports that were created as masters (failover may promote replicas later)."""
        return self.ports[: self.masters]

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """(host, port) of every node: pass them all as `startup_nodes` when a test kills the
        node that `url` names (a client bootstrapping from a dead node alone cannot connect)."""
        return [("127.0.0.1", node.port) for node in self.nodes]

    @property
    def url(self) -> str:
        if not self.nodes:
            raise RedisClusterError("the cluster is not started")
        return f"redis://127.0.0.1:{self.nodes[0].port}"

    @property
    def running(self) -> bool:
        return bool(self.nodes) and all(node.running for node in self.nodes)

    def start(self) -> str:
        """Start every node, create the cluster, wait until it is healthy; return `url`."""
        if self.nodes:
            return self.url
        if not self._registered:
            atexit.register(self.stop)
            self._registered = True
        last_error = ""
        for _ in range(START_ATTEMPTS):
            try:
                self._spawn_all()
                self._create()
                self.wait_ok()
                self._wait_followed()
                return self.url
            except RedisClusterError as error:
                last_error = str(error)
                self._stop_nodes()
        raise RedisClusterError(f"redis cluster did not start: {last_error}")

    def wait_ok(self, timeout: float | None = None, ports: list[int] | None = None) -> None:
        """Wait until `ports` (default: every running node) report cluster_state:ok, all slots."""
        timeout = self.ready_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + timeout
        last: dict[int, dict[str, str]] = {}
        while True:
            check = ports if ports is not None else [n.port for n in self.nodes if n.running]
            last = {port: _cluster_info(port) for port in check}
            if all(cluster_ok(info, len(self.nodes)) for info in last.values()) and all(
                replication_up(port) for port in check
            ):
                return
            if time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        states = {
            port: (info.get("cluster_state"), info.get("cluster_slots_ok"))
            for port, info in last.items()
        }
        raise RedisClusterError(
            f"cluster not ok after {timeout:.0f} s: state/slots_ok per port {states}\n"
            + self._logs()
        )

    def _wait_followed(self) -> None:
        """Wait until the node `cluster_nodes` asks knows whom every replica follows: it
        learns that by gossip, a moment after replication is up (two CI runs asked right
        after the start and found a master without replicas)."""
        deadline = time.monotonic() + self.ready_timeout_s
        replicas = len(self.nodes) - self.masters
        while sum(row["master"] != "-" for row in self.cluster_nodes()) < replicas:
            if time.monotonic() >= deadline:
                raise RedisClusterError("the replicas' masters are not known everywhere")
            time.sleep(0.05)

    def cluster_nodes(self, port: int | None = None) -> list[dict[str, str]]:
        """`CLUSTER NODES` as seen by `port` (default: the first running node), one dict a node:
        id, addr (host:port), port, flags (e.g. "myself,master"), master (id or "-"), link, slots.
        """
        if port is None:
            port = next(n.port for n in self.nodes if n.running)
        raw = _command(port, "CLUSTER", "NODES").decode(errors="replace")
        rows = []
        for line in raw.splitlines():
            parts = line.split()
            if len(parts) < 8 or line.startswith("$"):
                continue
            addr = parts[1].split("@")[0]
            rows.append(
                {
                    "id": parts[0],
                    "addr": addr,
                    "port": addr.rsplit(":", 1)[1],
                    "flags": parts[2],
                    "master": parts[3],
                    "link": parts[7],
                    "slots": " ".join(parts[8:]),
                }
            )
        return rows

    def current_master_ports(self) -> list[int]:
        """Ports of the nodes that are masters now and not failed (changes after a failover)."""
        return sorted(
            int(row["port"])
            for row in self.cluster_nodes()
            if "master" in row["flags"] and "fail" not in row["flags"]
        )

    def kill(self, port: int) -> None:
        """SIGKILL the node on `port` (no shutdown work at all)."""
        node = self._node(port)
        proc, node.process = node.process, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)

    def replica_of(self, port: int) -> int:
        """The port of a replica that follows the master on `port` now."""
        return self.replicas_of(port)[0]

    def replicas_of(self, port: int) -> list[int]:
        """The ports of the replicas that follow the master on `port` now."""
        rows = self.cluster_nodes()
        master = next(row["id"] for row in rows if int(row["port"]) == port)
        return [int(row["port"]) for row in rows if row["master"] == master]

    def log_of(self, port: int) -> str:
        """What the node on `port` logged so far."""
        return self._node(port).log.read_text(errors="replace")

    def pause(self, port: int) -> None:
        """SIGSTOP the node on `port`: it neither answers nor replicates until `resume`."""
        node = self._node(port)
        if node.process is not None:
            node.process.send_signal(signal.SIGSTOP)

    def cut_replica_links(self, port: int) -> None:
        """Make the master on `port` drop its replicas' connections (a broken link)."""
        _command(port, "CLIENT", "KILL", "TYPE", "replica")

    def resume(self, port: int) -> None:
        node = self._node(port)
        if node.process is not None:
            node.process.send_signal(signal.SIGCONT)

    def kill_holding_unreplicated_writes(self, victim: int, lag_s: float) -> None:
        """Fail the master on `victim` over while it holds writes no replica has: its
        replica's link breaks and cannot come back (the replica is stopped) for `lag_s` of
        writes, then the master dies, its replica takes over and the old master follows it
        (what WAIT is for)."""
        behind = self.replica_of(victim)
        self.pause(behind)
        self.cut_replica_links(victim)
        time.sleep(lag_s)
        self.kill(victim)
        self.resume(behind)
        self.wait_ok(30.0)  # the replica took over
        self.revive(victim)  # ... and the old master follows it
        self.wait_ok(30.0)

    def revive(self, port: int) -> None:
        """Start a killed node again from its directory: it rejoins the cluster with the
        configuration it kept (`nodes.conf`), as a replica if another node took its slots."""
        node = self._node(port)
        if node.running:
            return
        self._spawn(node)
        deadline = time.monotonic() + NODE_START_TIMEOUT_S
        while True:
            with contextlib.suppress(OSError):
                if _command(port, "PING", timeout=0.5).startswith(b"+PONG"):
                    return
            if time.monotonic() >= deadline:
                raise RedisClusterError(f"node {port} did not come back\n" + node.log_tail())
            time.sleep(0.02)

    def stop(self) -> None:
        """Kill every node and remove their directories; safe to call twice."""
        self._stop_nodes()
        if self._registered:
            with contextlib.suppress(Exception):
                atexit.unregister(self.stop)
            self._registered = False

    # -- internals ------------------------------------------------------------------------

    def _node(self, port: int) -> ClusterNode:
        for node in self.nodes:
            if node.port == port:
                return node
        raise KeyError(f"no cluster node on port {port} (ports: {self.ports})")

    def _spawn_all(self) -> None:
        count = self.masters * (1 + self.replicas)
        # Every node needs a client port and a cluster-bus port. The bus defaults to port + 10000
        # (so ports above 55535 fail); `--cluster-port` (Redis >= 7) lets the OS pick both.
        ports: list[int] = []
        while len(ports) < 2 * count:
            port = free_port()
            if port not in ports:
                ports.append(port)
        for port, bus_port in zip(ports[:count], ports[count:], strict=True):
            node = ClusterNode(
                port=port,
                bus_port=bus_port,
                directory=Path(tempfile.mkdtemp(prefix="agon-cluster-")),
            )
            self.nodes.append(node)
            self._spawn(node)
        deadline = time.monotonic() + NODE_START_TIMEOUT_S
        pending = list(self.nodes)
        while pending:
            for node in list(pending):
                if node.process is not None and node.process.poll() is not None:
                    raise RedisClusterError(
                        f"node {node.port} exited with {node.process.returncode}: "
                        + node.log_tail()
                    )
                with contextlib.suppress(OSError):
                    if _command(node.port, "PING", timeout=0.5).startswith(b"+PONG"):
                        pending.remove(node)
            if pending and time.monotonic() >= deadline:
                raise RedisClusterError(
                    f"nodes {[n.port for n in pending]} did not answer PING within "
                    f"{NODE_START_TIMEOUT_S} s\n" + self._logs()
                )
            if pending:
                time.sleep(0.02)

    def _spawn(self, node: ClusterNode) -> None:
        node.process = subprocess.Popen(
            self._args(node),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            # preexec_fn is unsafe only with threads forking concurrently; we start first.
            preexec_fn=_die_with_parent,
        )

    def _args(self, node: ClusterNode) -> list[str]:
        return node_args(self.binary, node, self.node_timeout_ms, self.options)

    def _create(self) -> None:
        args = [
            self.cli,
            "--cluster",
            "create",
            *(f"127.0.0.1:{port}" for port in self.ports),
            "--cluster-replicas",
            str(self.replicas),
            "--cluster-yes",
        ]
        try:
            done = subprocess.run(
                args,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=self.ready_timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired as error:
            raise RedisClusterError(f"redis-cli --cluster create timed out: {error}") from None
        if done.returncode != 0:
            out = (done.stdout + done.stderr).decode(errors="replace")[-1500:]
            raise RedisClusterError(
                f"redis-cli --cluster create failed ({done.returncode}):\n{out}\n" + self._logs()
            )

    def _logs(self) -> str:
        return "\n".join(
            f"--- node {node.port} log tail ---\n{node.log_tail()}" for node in self.nodes
        )

    def _stop_nodes(self) -> None:
        nodes, self.nodes = self.nodes, []
        procs = []
        for node in nodes:
            proc, node.process = node.process, None
            if proc is not None and proc.poll() is None:
                proc.kill()
                procs.append(proc)
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        for node in nodes:
            shutil.rmtree(node.directory, ignore_errors=True)
