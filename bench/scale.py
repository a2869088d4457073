"""The scale-out curve (`agon bench scale`, `make scale`): Agon on 1, 2, 4, 8 simulated hosts,
each with a fixed CPU budget, and what a host's death costs.

A host is a Linux network namespace (`agon-h<i>`, address 10.77.0.<i+1>/24 on a veth pair to
the bridge `agon-br0` in the root namespace, loopback up) whose processes sit in a cgroup v1
(`/sys/fs/cgroup/cpu/agon-scale/h<i>`, `cpu.cfs_quota_us` = `--cpu` x `cpu.cfs_period_us`;
the same group under `cpuacct` counts its CPU). Each host runs a Redis Cluster master (its
slots hold an equal share of the partitions, `bench.cluster.slot_ranges`; its replica on
the next host; with one host both on it; cluster-node-timeout 0.3 s and no full coverage
required, so survivors go on serving while a master fails over), an engine, a
projector, a dispatcher, a `random` bot worker and a gateway (`bench.gateway`'s, whose
quotas let one address create every game), all as `bench.fleet` starts them, sharing
`AGON_SECRET`. The quotas are set once every process of the host said it was ready: start-up
is not what is measured. Each host count gets a fresh layout, torn down before the next.

This process is the load generator, in the root namespace outside every quota: it keeps
`--games` games per host going between two `random` bots, created through the gateways
(replaced as they end), and plays people's games over the gateways' REST at
`PEOPLE_MOVES_PER_HOST_S` moves a second per host, each sent when it is due whether or not
the last was answered (open loop; a due move finding every people's game waiting on an
answer is counted as unserved). It follows every partition's feed with `bench.load`'s
`Tracker`. Per host count, over `--seconds` after a warm-up: moves/s (MovePlayed entries on
the feeds, over the window), command->event p50/p99 (`Tracker`: the command's XADD to its
MovePlayed's), append conflicts per 1,000 moves (the engines' heartbeats), each host's CPU
in cores (cpuacct), Redis commands per move (`total_commands_processed` over every master)
and the scaling efficiency, throughput(N) / (N x throughput(1)).

`--kill-host` adds a run at the largest host count (at least 3; each master then has a
second replica, two hosts on, so that no survivor's writes wait for a replica that died):
after the window one host's link goes down and every process of it (Redis included) gets
SIGKILL. It reports when the dead master's slots were served again (its replica promoted)
and when every bot game in play at the kill (moved in the last 2 s, not ended) moved again
(or ended), by partition too, then lets every game end and checks the logs: each move a
gateway acknowledged is there once, each event seen on a feed is still there, every game
ended, and `agon verify` passes.

Everything made (namespaces, links, the bridge, cgroups, processes) is undone however the
run ends: on return, an exception, Ctrl-C or SIGTERM; what a killed earlier run left is
removed first. Without root or `ip` the hosts share the loopback (127.0.0.<i+1>) with the
quotas alone; without the cgroup v1 cpu controller they run without quotas, each host's
CPU read from its processes. One run at a time per machine (a lock file says so).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from redis.crc import key_slot
from rich.console import Console
from rich.table import Table

from bench.cluster import (
    ClusterNode,
    cluster_info,
    cluster_ok,
    command,
    form,
    node_args,
    replication_up,
    slot_ranges,
)
from bench.fleet import Fleet, Service
from bench.gateway import KeepAlive, address_of
from bench.load import Tracker, engine_counts, group_lag, parse_counts, take
from bench.measure import cpu_seconds, quantile, raise_open_files
from engine import State, load_game
from schemas.codec import FIELD_BYTES, unpack
from schemas.tokens import new_secret
from services.bus.clients import log_entries
from services.bus.connection import AgonCluster, Client, connect
from services.bus.delivery import pending_turns
from services.bus.embedded import _die_with_parent, find_redis_server
from services.bus.keys import Keys
from services.bus.text import as_text, id_ms, now_ms
from services.cli.options import UsageError

SUBNET = "10.77.0"
BRIDGE = "agon-br0"
#: host i's namespace is agon-h<i>; the root side of its link agon-v<i>
NETNS = "agon-h"
VETH = "agon-v"
CGROUP = "agon-scale"
CPU_ROOT = Path("/sys/fs/cgroup/cpu")
CPUACCT_ROOT = Path("/sys/fs/cgroup/cpuacct")
PERIOD_US = 100_000
LOCK = Path(tempfile.gettempdir()) / "agon-bench-scale.lock"
PREFIX = "agon"
GAME = "teeko"
BOT = "random"
DEFAULT_HOSTS = "1,2,4,8"
DEFAULT_CPU = 0.2
#: Bot games kept going per host (`--games`), and people's games and moves per host.
BOT_GAMES_PER_HOST = 32
PEOPLE_GAMES_PER_HOST = 4
PEOPLE_MOVES_PER_HOST_S = 10.0
NODE_TIMEOUT_MS = 300
#: Options of every Redis node beyond `bench.cluster.node_args`: survivors serve their slots
#: while a master fails over, any replica may take over however long it was cut off, and
#: the other hosts may connect (the bridge is private; protected mode admits loopback only).
NODE_OPTIONS = (
    "--cluster-require-full-coverage", "no",
    "--cluster-replica-validity-factor", "0",
    "--protected-mode", "no",
)  # fmt: skip
CLUSTER_TIMEOUT_S = 60.0
READY_TIMEOUT_S = 180.0
WARMUP_S = 5.0
TICK_S = 0.05
REQUEST_TIMEOUT_S = 15.0
#: After a kill: how long play may take to resume, the load to run on, and games to end.
RESUME_TIMEOUT_S = 60.0
#: A game is in play at a kill when it moved this recently and has not ended (ms).
IN_PLAY_MS = 2000
AFTER_KILL_S = 5.0
DRAIN_TIMEOUT_S = 180.0
VERIFY_TIMEOUT_S = 600.0
#: How long a step of a run's cleanup may take before it is given up (and reported).
CLEANUP_S = 30.0
#: Hosts using less than this share of their quota were held back by something else: the
#: load offered, or the machine.
QUOTA_BOUND = 0.85
_CLONE_NEWNET = 0x40000000


class ScaleError(RuntimeError):
    """The layout could not be built, or the run could not go on."""


class Say:
    """One line per phase on stderr, with the time since the run began."""

    def __init__(self) -> None:
        self.console = Console(stderr=True, highlight=False)
        self.began = time.monotonic()

    def __call__(self, text: str) -> None:
        elapsed = time.monotonic() - self.began
        self.console.print(f"[dim]\\[scale {elapsed:6.1f} s][/dim] {text}")


# -- the machine: commands, namespaces, cgroups ------------------------------------------------
def run(*argv: str, check: bool = True) -> str:
    """Run a command; its output, or a `ScaleError` with its error output."""
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise ScaleError(f"`{' '.join(argv)}` failed: {done.stderr.strip() or done.returncode}")
    return done.stdout


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, _CLONE_NEWNET) != 0:
        raise ScaleError(f"setns failed: {os.strerror(ctypes.get_errno())}")


@contextlib.contextmanager
def entered(netns: str | None) -> Iterator[None]:
    """This thread in network namespace `netns` for the block (processes started in it are
    born there); None: where it is. Nothing awaits inside, so no other task runs there."""
    if netns is None:
        yield
        return
    with open(f"/run/netns/{netns}", "rb") as there, open("/proc/thread-self/ns/net", "rb") as home:
        _setns(there.fileno())
        try:
            yield
        finally:
            _setns(home.fileno())


def kill_pids(pids: Sequence[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _pids_of(path: Path) -> list[int]:
    try:
        return [int(line) for line in path.read_text().split()]
    except OSError:
        return []


def listen_ports() -> Iterator[int]:
    """Ports for the hosts' listeners (Redis nodes, gateways): below the kernel's ephemeral
    range, from a random start, each free on the root namespace's loopback. A port the OS
    picks as free is drawn from that range, as are the source ports of the hosts' own
    outgoing connections: a gateway started after its host's engine once found its port
    taken by one of them ("address already in use")."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    # A host's namespace has the kernel's default range, whatever the root's says.
    ports = list(range(10_000, max(min(low, 32768), 20_000)))
    start = random.randrange(len(ports))
    for port in ports[start:] + ports[:start]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        yield port


@dataclass
class CpuGroup:
    """A host's cgroup under the cpu controller (the quota) and cpuacct (its CPU time)."""

    name: str

    @property
    def cpu(self) -> Path:
        return CPU_ROOT / CGROUP / self.name

    @property
    def acct(self) -> Path:
        return CPUACCT_ROOT / CGROUP / self.name

    def create(self) -> None:
        for path in (self.cpu, self.acct):
            path.mkdir(parents=True, exist_ok=True)
        (self.cpu / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        self.limit(None)

    def add(self, pid: int) -> None:
        for path in (self.cpu, self.acct):
            with contextlib.suppress(ProcessLookupError):
                (path / "cgroup.procs").write_text(str(pid))

    def limit(self, cores: float | None) -> None:
        """The quota: `cores` of CPU time per period, or none."""
        quota = -1 if cores is None else max(1000, round(cores * PERIOD_US))
        (self.cpu / "cpu.cfs_quota_us").write_text(str(quota))

    def used_s(self) -> float:
        return int((self.acct / "cpuacct.usage").read_text()) / 1e9

    def throttled_s(self) -> float:
        """CPU time the quota held the group back, so far (cpu.stat `throttled_time`)."""
        for line in (self.cpu / "cpu.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "throttled_time":
                return int(value) / 1e9
        return 0.0


def remove_cgroup(path: Path) -> None:
    """Kill what is left in a cgroup, then remove it (children first)."""
    if not path.is_dir():
        return
    for child in path.iterdir():
        if child.is_dir():
            remove_cgroup(child)
    deadline = time.monotonic() + 5.0
    while pids := _pids_of(path / "cgroup.procs"):
        kill_pids(pids)
        if time.monotonic() > deadline:
            raise ScaleError(f"processes {pids} would not leave {path}")
        time.sleep(0.05)
    while True:
        try:
            path.rmdir()
            return
        except OSError:  # the kernel may still be reaping the last member
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@dataclass(frozen=True)
class Lab:
    """What this machine allows: namespaces (root and `ip`) and cgroup v1 cpu quotas."""

    namespaces: bool
    cgroups: bool
    notes: tuple[str, ...] = ()

    @classmethod
    def probe(cls) -> Lab:
        root = os.geteuid() == 0
        ip = shutil.which("ip") is not None
        namespaces = root and ip and Path("/proc/thread-self/ns/net").exists()
        cgroups = (
            root
            and (CPU_ROOT / "cpu.cfs_quota_us").exists()
            and (CPUACCT_ROOT / "cpuacct.usage").exists()
        )
        notes = []
        if not namespaces:
            why = "not root" if not root else "no `ip` command"
            notes.append(
                f"network namespaces unavailable ({why}): the hosts share the loopback"
                " (127.0.0.<i+1>)" + (" with the CPU quotas alone" if cgroups else "")
            )
        if not cgroups:
            why = "not root" if not root else f"no cgroup v1 cpu/cpuacct at {CPU_ROOT.parent}"
            notes.append(
                f"cgroups unavailable ({why}): no CPU quotas; each host's CPU is its processes'"
            )
        return cls(namespaces, cgroups, tuple(notes))

    def address(self, i: int) -> str:
        return f"{SUBNET}.{i + 1}" if self.namespaces else f"127.0.0.{i + 1}"

    def leftovers(self) -> list[str]:
        """What a run of this harness made that still exists."""
        found = []
        if self.namespaces:
            found += [f"namespace {n}" for n in our_namespaces()]
            found += [f"link {n}" for n in our_links()]
        if self.cgroups:
            found += [
                f"cgroup {p}" for p in (CPU_ROOT / CGROUP, CPUACCT_ROOT / CGROUP) if p.exists()
            ]
        return found

    def clean(self) -> list[str]:
        """Remove whatever a run of this harness left (processes first); what was removed."""
        found = self.leftovers()
        if self.cgroups:
            for base in (CPU_ROOT / CGROUP, CPUACCT_ROOT / CGROUP):
                remove_cgroup(base)
        if self.namespaces:
            for name in our_namespaces():
                kill_pids([int(p) for p in run("ip", "netns", "pids", name, check=False).split()])
                run("ip", "netns", "del", name, check=False)
            for name in our_links():
                run("ip", "link", "del", name, check=False)
        return found


def our_namespaces() -> list[str]:
    lines = run("ip", "netns", "list", check=False).splitlines()
    return [line.split()[0] for line in lines if line.startswith(NETNS)]


def our_links() -> list[str]:
    names = [line.split(":")[1].strip().split("@")[0] for line in
             run("ip", "-o", "link", "show", check=False).splitlines() if ":" in line]  # fmt: skip
    return [n for n in names if n == BRIDGE or n.startswith(VETH)]


@contextlib.contextmanager
def one_at_a_time() -> Iterator[None]:
    """Hold the machine's scale lock: two runs would tear each other's hosts down."""
    with LOCK.open("a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UsageError(f"another `agon bench scale` is running ({LOCK} is held)") from None
        yield


# -- one host count: the layout ----------------------------------------------------------------
@dataclass
class Host:
    index: int
    address: str
    netns: str | None
    group: CpuGroup | None
    fleet: Fleet | None = None
    nodes: list[ClusterNode] = field(default_factory=list)
    gateway: str = ""
    alive: bool = True

    @property
    def name(self) -> str:
        return f"h{self.index}"

    @property
    def veth(self) -> str:
        return f"{VETH}{self.index}"

    @property
    def master(self) -> ClusterNode:
        return self.nodes[0]

    @property
    def url(self) -> str:
        return f"redis://{self.address}:{self.master.port}"

    def pids(self) -> list[int]:
        services = [s.process.pid for s in self.fleet.running] if self.fleet else []
        return services + [n.process.pid for n in self.nodes if n.process and n.running]

    def processes(self) -> list[tuple[str, int]]:
        """(kind, pid) of every process of the host: its services, then its Redis nodes."""
        out = [(s.kind, s.process.pid) for s in self.fleet.running] if self.fleet else []
        for k, node in enumerate(self.nodes):
            if node.process is not None and node.running:
                out.append(("redis master" if k == 0 else "redis replica", node.process.pid))
        return out

    def cpu_s(self) -> float:
        if self.group is not None:
            return self.group.used_s()
        return sum(cpu_seconds(pid) or 0.0 for pid in self.pids())


class Testbed:
    """N hosts: their network, cgroups, Redis Cluster and services. `close` undoes all that
    was made, whatever `start` got to."""

    def __init__(
        self,
        lab: Lab,
        count: int,
        cpu: float,
        replicas: int,
        say: Callable[[str], None],
        keep_logs: bool = False,
        pace_ms: int = 0,
    ) -> None:
        self.lab = lab
        self.pace_ms = pace_ms
        self.count = count
        self.cpu = cpu
        self.replicas = replicas
        self.say = say
        self.secret = new_secret().decode()
        #: each master's slots: an equal share of the partitions on each
        keys = Keys(prefix=PREFIX)
        self.slot_ranges = slot_ranges(count, [keys.slot(p) for p in keys.all_partitions()])
        self.dir = Path(tempfile.mkdtemp(prefix="agon-scale-"))
        self.binary = find_redis_server()
        self.hosts = [
            Host(
                i,
                lab.address(i),
                f"{NETNS}{i}" if lab.namespaces else None,
                CpuGroup(f"h{i}") if lab.cgroups else None,
            )
            for i in range(count)
        ]
        #: the services run with -v, and every log stays (`--keep-logs`; also when one failed)
        self.keep_logs = keep_logs
        self.ports = listen_ports()

    def __enter__(self) -> Testbed:
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        self.close(failed=kind is not None and not issubclass(kind, KeyboardInterrupt))

    @property
    def label(self) -> str:
        return f"{self.count} host{'s' * (self.count != 1)}"

    def start(self) -> None:
        began = time.monotonic()
        self._network()
        self._redis()
        self.say(
            f"{self.label}: Redis Cluster ok ({self.count} masters, {self.replicas} replica(s)"
            f" each) in {time.monotonic() - began:.1f} s"
        )
        began = time.monotonic()
        self._services()
        quota = f"quota {self.cpu:g} cores a host" if self.lab.cgroups else "no quota"
        self.say(
            f"{self.label}: {5 * self.count} services ready in {time.monotonic() - began:.1f} s;"
            f" {quota}"
        )

    # -- building
    def _network(self) -> None:
        if self.lab.cgroups:
            for base in (CPU_ROOT / CGROUP, CPUACCT_ROOT / CGROUP):
                base.mkdir(exist_ok=True)
            for host in self.hosts:
                assert host.group is not None
                host.group.create()
        if not self.lab.namespaces:
            self.say(f"{self.label}: on the loopback, 127.0.0.1-{self.count}")
            return
        run("ip", "link", "add", BRIDGE, "type", "bridge")
        run("ip", "addr", "add", f"{SUBNET}.254/24", "dev", BRIDGE)
        run("ip", "link", "set", BRIDGE, "up")
        for host in self.hosts:
            assert host.netns is not None
            run("ip", "netns", "add", host.netns)
            run("ip", "link", "add", host.veth, "type", "veth", "peer", "name", "eth0",
                "netns", host.netns)  # fmt: skip
            run("ip", "link", "set", host.veth, "master", BRIDGE, "up")
            run("ip", "-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
            run("ip", "-n", host.netns, "link", "set", "eth0", "up")
            run("ip", "-n", host.netns, "link", "set", "lo", "up")
        self.say(
            f"{self.label}: network up ({', '.join(h.netns or '' for h in self.hosts)} on"
            f" {BRIDGE}, {SUBNET}.0/24)"
        )

    def _spawn(self, host: Host, node: ClusterNode) -> None:
        # The address is announced, not learnt from a peer's socket: on the loopback that
        # would be 127.0.0.1 for every node.
        options = (*NODE_OPTIONS, "--cluster-announce-ip", node.host)
        with entered(host.netns):
            node.process = subprocess.Popen(
                node_args(self.binary, node, NODE_TIMEOUT_MS, options),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                preexec_fn=_die_with_parent,
            )
        if host.group is not None:
            host.group.add(node.process.pid)

    def _redis(self) -> None:
        for host in self.hosts:
            for k in range(1 + self.replicas):  # the master, then a replica per master behind
                directory = self.dir / f"redis-{host.name}-{k}"
                directory.mkdir()
                node = ClusterNode(next(self.ports), next(self.ports), directory, host=host.address)
                host.nodes.append(node)
                self._spawn(host, node)
        nodes = [n for h in self.hosts for n in h.nodes]
        self._until(lambda: all(_pong(n) for n in nodes), "every Redis node answering PING")
        pairs = [
            (host.nodes[k], self.hosts[(host.index - k) % self.count].master)
            for host in self.hosts
            for k in range(1, 1 + self.replicas)
        ]
        form([h.master for h in self.hosts], pairs, ranges=self.slot_ranges)
        self._until(
            lambda: all(
                cluster_ok(_info(n), len(nodes)) and replication_up(n.port, n.host) for n in nodes
            ),
            "the cluster ok on every node, every replica in sync",
        )

    def _until(self, check: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + CLUSTER_TIMEOUT_S
        while not check():
            dead = [n for h in self.hosts for n in h.nodes if not n.running]
            if dead or time.monotonic() > deadline:
                tails = "; ".join(f"{n.host}:{n.port}: {n.log_tail(300)}" for n in dead)
                raise ScaleError(f"{self.label}: no {what} in {CLUSTER_TIMEOUT_S:g} s {tails}")
            time.sleep(0.05)

    def _services(self) -> None:
        started: list[tuple[Host, list[Service]]] = []
        for host in self.hosts:
            host.fleet = fleet = Fleet(
                host.url, PREFIX, env={"AGON_SECRET": self.secret}, name=f"scale-{host.name}",
                ready_timeout_s=READY_TIMEOUT_S, stop_timeout_s=5.0, verbose=self.keep_logs,
            )  # fmt: skip
            port = next(self.ports)
            host.gateway = f"http://{host.address}:{port}"
            kinds: list[tuple[str, tuple[str, ...], str]] = [
                ("engine", (), "services.cli"),
                ("projector", (), "services.cli"),
                ("dispatcher", (), "services.cli"),
                ("bots", ("--bot", BOT, "--pace-ms", str(self.pace_ms)), "services.cli"),
                ("gateway", ("--host", host.address, "--port", str(port)), "bench.gateway"),
            ]
            services = []
            for kind, args, module in kinds:
                with entered(host.netns):
                    service = fleet.start(kind, *args, module=module)
                if host.group is not None:
                    host.group.add(service.process.pid)
                services.append(service)
            started.append((host, services))
        for host, services in started:
            assert host.fleet is not None
            host.fleet.wait_ready(services)
        for host in self.hosts:
            if host.group is not None:
                host.group.limit(self.cpu)

    # -- during the run
    def masters(self) -> list[ClusterNode]:
        return [h.master for h in self.hosts if h.alive]

    def commands(self) -> int:
        """Commands processed so far, summed over the (first) masters still alive."""
        total = 0
        for node in self.masters():
            raw = command(node.port, "INFO", "stats", host=node.host).decode(errors="replace")
            for line in raw.splitlines():
                if line.startswith("total_commands_processed:"):
                    total += int(line.split(":")[1])
        return total

    def cpu_s(self) -> list[float]:
        return [h.cpu_s() if h.alive else 0.0 for h in self.hosts]

    def cpu_by_kind(self) -> list[dict[str, float]]:
        """CPU seconds so far per kind of process, per host (none for a dead one)."""
        out: list[dict[str, float]] = []
        for host in self.hosts:
            used: dict[str, float] = {}
            for kind, pid in host.processes() if host.alive else ():
                used[kind] = used.get(kind, 0.0) + (cpu_seconds(pid) or 0.0)
            out.append(used)
        return out

    def throttled_s(self) -> list[float]:
        return [h.group.throttled_s() if h.group and h.alive else 0.0 for h in self.hosts]

    def errors(self) -> dict[str, Any]:
        return {
            f"{h.name} {k}": v for h in self.hosts if h.fleet for k, v in h.fleet.errors().items()
        }

    def kill(self, host: Host) -> None:
        """Take the host's link down and SIGKILL every process of it, Redis included."""
        if host.netns is not None:
            run("ip", "link", "set", host.veth, "down")
        host.alive = False
        if host.fleet is not None:
            for service in list(host.fleet.running):
                host.fleet.kill(service)
        for node in host.nodes:
            if node.process is not None and node.running:
                node.process.kill()
                node.process.wait(timeout=5)
        if host.group is not None:
            kill_pids(_pids_of(host.group.cpu / "cgroup.procs"))

    def slots_served_without(self, dead: ClusterNode) -> bool:
        """Whether a survivor says every slot is served by a live master other than `dead`."""
        survivor = next(h.master for h in self.hosts if h.alive)
        try:
            raw = command(survivor.port, "CLUSTER", "NODES", host=survivor.host)
        except OSError:
            return False
        served = 0
        for line in raw.decode(errors="replace").splitlines():
            parts = line.split()
            if len(parts) < 8 or "master" not in parts[2] or "fail" in parts[2]:
                continue
            if parts[1].split("@")[0] == f"{dead.host}:{dead.port}":
                continue
            for span in parts[8:]:
                if not span.startswith("["):
                    lo, _, hi = span.partition("-")
                    served += int(hi or lo) - int(lo) + 1
        return served == 16384

    # -- undoing
    def close(self, failed: bool = False) -> None:
        """Stop every process, remove every node's files, namespace, link and cgroup; a
        second Ctrl-C or SIGTERM meanwhile is ignored (it would leave them behind)."""
        previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            for host in self.hosts:
                if host.group is not None and host.group.cpu.exists():
                    host.group.limit(None)  # a throttled process takes long to stop
            for host in self.hosts:
                if host.fleet is not None:
                    errors = host.fleet.errors()
                    self.keep_logs = self.keep_logs or bool(errors)
                    host.fleet.close(keep=failed or self.keep_logs)
            for host in self.hosts:
                for node in host.nodes:
                    if node.process is not None and node.running:
                        node.process.kill()
                        node.process.wait(timeout=5)
            if not (failed or self.keep_logs):
                shutil.rmtree(self.dir, ignore_errors=True)
            self.lab.clean()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)


def _info(node: ClusterNode) -> dict[str, str]:
    return cluster_info(node.port, node.host)


def _pong(node: ClusterNode) -> bool:
    try:
        return command(node.port, "PING", host=node.host, timeout=0.5).startswith(b"+PONG")
    except OSError:
        return False


# -- the load generator ------------------------------------------------------------------------
class Gateways:
    """Keep-alive connections to the live gateways, each request to the next gateway in turn;
    one that does not answer (a connection refused, reset or timed out) is tried on the next."""

    def __init__(self, bases: Sequence[str]) -> None:
        self.idle: dict[str, list[KeepAlive]] = {base: [] for base in bases}
        self.turn = 0

    def drop(self, base: str) -> None:
        for connection in self.idle.pop(base, []):
            connection.close()

    def close(self) -> None:
        for base in list(self.idle):
            self.drop(base)

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        status, answer = 0, {"code": "no gateway"}
        for _ in range(max(1, len(self.idle))):
            if not self.idle:
                break
            bases = list(self.idle)
            base = bases[self.turn % len(bases)]
            self.turn += 1
            pool = self.idle[base]
            connection = pool.pop() if pool else KeepAlive(*address_of(base))
            try:
                status, answer = await asyncio.wait_for(
                    connection.post(path, body), REQUEST_TIMEOUT_S
                )
            except TimeoutError:
                status, answer = 0, {"code": "timeout"}
            except BaseException:  # cancelled (the run ends): the request is cut off
                connection.close()
                raise
            if status == 0 or base not in self.idle:
                connection.close()
            else:
                pool.append(connection)
            if status != 0:
                break
        return status, answer


@dataclass
class PersonGame:
    """A people's game: both seats' tokens, the position, and a move sent but not answered."""

    game_id: str
    tokens: list[str]
    state: State
    seq: int
    pending: str | None = None


class SeenTracker(Tracker):
    """`Tracker`, also remembering each event it saw on a feed: (game, seq) -> (type, time)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[tuple[str, int], tuple[str, int]] = {}

    def event(self, entry_ms: int, ev: dict[str, Any]) -> str | None:
        self.seen[(str(ev["game_id"]), int(ev["seq"]))] = (str(ev["type"]), int(ev["time"]))
        return super().event(entry_ms, ev)


class Load:
    """Bot games kept going through the gateways, and people's moves over REST, open loop."""

    def __init__(
        self, redis: Client, keys: Keys, gateways: Gateways, bot_games: int, people_games: int,
        people_rate: float, move_time: float | None = None,
    ) -> None:  # fmt: skip
        self.redis = redis
        self.move_time = move_time
        self.keys = keys
        self.gateways = gateways
        self.bot_target = bot_games
        self.people_target = people_games
        self.rate = people_rate
        self.rng = random.Random(1)
        self.bots: set[str] = set()
        self.people: dict[str, PersonGame] = {}
        self.idle: deque[str] = deque()
        self.created: list[str] = []
        #: (game, seq, move) of every move a gateway accepted (200)
        self.acked: list[tuple[str, int, str]] = []
        self.outcomes: Counter[str] = Counter()
        self.offered = 0
        self.unserved = 0
        self.replacing = True
        self.creating = Counter[str]()
        self.hold_until = 0.0
        self.tasks: set[asyncio.Task[None]] = set()

    def _spawn(self, work: Any) -> None:
        task = asyncio.create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            self.outcomes[f"failed: {type(exc).__name__}: {str(exc)[:100]}"] += 1

    def ended(self, game_id: str) -> None:
        self.bots.discard(game_id)

    @property
    def live(self) -> int:
        return len(self.bots) + len(self.people)

    async def run(self, stop: asyncio.Event) -> None:
        began = time.monotonic()
        while not stop.is_set():
            if self.replacing and time.monotonic() >= self.hold_until:
                self._refill()
            if self.replacing:
                due = int(self.rate * (time.monotonic() - began)) - self.offered
                for _ in range(max(0, due)):
                    self.offered += 1
                    if self.idle:
                        self._spawn(self._move(self.people[self.idle.popleft()]))
                    else:
                        self.unserved += 1
            else:  # draining: every people's game played to its end, as fast as answered
                while self.idle:
                    self._spawn(self._move(self.people[self.idle.popleft()]))
            await asyncio.sleep(TICK_S)

    async def stop(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    def _refill(self) -> None:
        for kind, have, target in (
            ("bots", len(self.bots), self.bot_target),
            ("people", len(self.people), self.people_target),
        ):
            for _ in range(target - have - self.creating[kind]):
                self.creating[kind] += 1
                self._spawn(self._create(kind))

    async def _create(self, kind: str) -> None:
        try:
            seat: dict[str, Any] = {"bot": BOT} if kind == "bots" else {"human": {}}
            body = {"game": GAME, "seats": [seat, seat], "seed": self.rng.randrange(1 << 30)}
            if kind == "bots" and self.move_time is not None:
                body["move_time"] = self.move_time
            status, answer = await self.gateways.post("/api/games", body)
            self.outcomes[f"create {status}"] += 1
            if status != 201:
                self.hold_until = time.monotonic() + 0.5
                return
            game_id = str(answer["id"])
            self.created.append(game_id)
            if kind == "bots":
                self.bots.add(game_id)
                return
            head = await self._head(game_id)
            state = load_game(GAME).new_initial_state()
            self.people[game_id] = PersonGame(game_id, list(answer["tokens"]), state, head)
            self.idle.append(game_id)
        finally:
            self.creating[kind] -= 1

    async def _head(self, game_id: str) -> int:
        """The seq of a new game's last event (its log's length), through a failover too."""
        for _ in range(40):
            try:
                return int(await self.redis.xlen(self.keys.log(game_id)))
            except Exception:  # its master is failing over
                await asyncio.sleep(0.25)
        raise ScaleError(f"could not read the log of {game_id} for 10 s")

    async def _move(self, game: PersonGame) -> None:
        """Send the game's next move (the one pending, again, after no answer): recorded as
        acknowledged, (game, its seq, move), once a gateway accepted it."""
        if game.pending is None:
            moves = game.state.legal_moves()
            game.pending = str(moves[self.rng.randrange(len(moves))])
        move = game.pending
        body = {
            "move": move,
            "seq": game.seq,
            "token": game.tokens[game.state.seat_to_move - 1],
            "command_id": f"m-{game.game_id}-{game.seq}",
        }
        status, answer = await self.gateways.post(f"/api/games/{game.game_id}/moves", body)
        self.outcomes[f"move {status}"] += 1
        if status == 200:
            self.acked.append((game.game_id, game.seq + 1, move))
            game.state.apply(move)
            game.seq, game.pending = int(answer["seq"]), None
            if game.state.is_terminal:
                del self.people[game.game_id]
                return
        elif status != 0 and status < 500:  # refused for good: the game is given up
            self.outcomes[f"given up: {answer.get('code')}"] += 1
            del self.people[game.game_id]
            return
        self.idle.append(game.game_id)


class Feeds:
    """Every partition's feed, a blocking read each (no cluster command spans two slots),
    into the tracker; games that end leave the load. Notes each game in play (its partition
    and latest move) and, once `since` is set, each game's first move (or end) after it."""

    def __init__(self, redis: Client, keys: Keys, tracker: Tracker, load: Load) -> None:
        self.redis = redis
        self.keys = keys
        self.tracker = tracker
        self.load = load
        #: per game that moved and has not ended: its partition and when it last moved
        self.moving: dict[str, tuple[int, int]] = {}
        self.next_after: dict[str, int] = {}
        #: when each game that ended did (its end's entry id)
        self.ended_at: dict[str, int] = {}
        #: each game's first move after `since`: when the move before it was, and the move
        self.first_moves: dict[str, FirstMove] = {}
        self.since: int | None = None
        self.errors: Counter[str] = Counter()

    async def run(self, stop: asyncio.Event) -> None:
        await asyncio.gather(*(self._lane(p, stop) for p in self.keys.all_partitions()))

    async def _lane(self, p: int, stop: asyncio.Event) -> None:
        feed, last = self.keys.feed(p), "0-0"
        while not stop.is_set():
            try:
                reply: Any = await self.redis.xread({feed: last}, count=1000, block=250)
            except Exception as exc:  # its master is failing over: read on once it is back
                self.errors[type(exc).__name__] += 1
                await asyncio.sleep(0.1)
                continue
            for _, entries in reply or ():
                for entry_id, fields in entries:
                    last = entry_id
                    data = fields.get(FIELD_BYTES)
                    if data is not None:
                        await self._event(p, id_ms(entry_id), unpack(data))

    async def _event(self, p: int, ms: int, ev: dict[str, Any]) -> None:
        game_id, kind = str(ev["game_id"]), ev["type"]
        if kind in ("move_played", "game_ended") and self.since is not None and ms > self.since:
            self._first_after(game_id, p, ms, ev)
        if kind == "move_played":
            self.moving[game_id] = (p, ms)
        elif kind == "game_ended":
            self.moving.pop(game_id, None)
            self.ended_at[game_id] = ms
        if await take(self.redis, self.keys, self.tracker, ms, ev) is not None:
            self.load.ended(game_id)

    def _first_after(self, game_id: str, p: int, ms: int, ev: dict[str, Any]) -> None:
        """Note the game's first move or end after `since` (and of a move, its wait)."""
        if self.next_after.setdefault(game_id, ms) != ms or ev["type"] != "move_played":
            return
        if game_id not in self.first_moves and game_id in self.moving:
            # A move the engine played for a seat that overran its clock: no bot's time.
            think = 0 if ev.get("timeout") else int(ev.get("think_ms", 0))
            before = self.moving[game_id][1]
            self.first_moves[game_id] = FirstMove(before, ms, int(ev.get("lag_ms", 0)), think)


@dataclass(frozen=True)
class FirstMove:
    """A game's first move after the kill: when the move before it gave the seat its turn
    (its entry id), when it was played, and the platform's lag and the bot's think time
    it carries (`MovePlayed`)."""

    turn_ms: int
    played_ms: int
    lag_ms: int
    think_ms: int

    def thinking_after(self, killed_ms: int) -> float:
        """How much of the bot's think time (s) fell after the kill, before the move."""
        took = self.turn_ms + self.lag_ms
        sent = min(took + self.think_ms, self.played_ms)
        return max(0, sent - max(took, killed_ms)) / 1000

    def where(self, killed_ms: int) -> dict[str, float]:
        """Where its time went, in seconds: the turn given (from the kill; below 0 before
        it), the turn delivered to a worker after that (the dispatcher's and the inbox's
        part, and a master's outage the engine judged the clock with), the move sent after
        that (the worker's: its bot's pace and its own work), and the move played after
        that (the engine's)."""
        sent = self.turn_ms + self.lag_ms + self.think_ms
        return {
            "turn_given_s": (self.turn_ms - killed_ms) / 1000,
            "delivered_after_s": self.lag_ms / 1000,
            "sent_after_s": self.think_ms / 1000,
            "played_after_s": (self.played_ms - sent) / 1000,
        }


def resumption(
    in_play: dict[str, int],
    bots: set[str],
    next_after: dict[str, int],
    killed_ms: int,
    on_dead: set[int],
    ended_at: dict[str, int],
    first_moves: dict[str, FirstMove] | None = None,
) -> dict[str, Any]:
    """When play resumed after a kill at `killed_ms`: for the games `in_play` then (game ->
    its partition), from each one's first move or end after it (`next_after`). The bot
    games are the platform's to move, so the figures are theirs (all of them, those on the
    dead master's partitions `on_dead`, and the survivors'), by partition too; the people's
    games move when the load offers their moves, so only their latest is told. A game whose
    end (`ended_at`) came before the kill, though read after it, was not in play. The
    slowest bot game's first move after the kill (`first_moves`) says where it waited, and
    `resumed_platform_s` leaves out of each game the time its bot took over that move (its
    think time, the bot's own on its clock, as the platform's lag is never the bot's)."""
    over = {g for g in in_play if ended_at.get(g, killed_ms + 1) <= killed_ms}
    in_play = {g: p for g, p in in_play.items() if g not in over}
    bots = bots - over
    resumed = {g: (next_after[g] - killed_ms) / 1000 for g in in_play if g in next_after}
    first_moves = first_moves or {}
    platform = {
        g: t - first_moves[g].thinking_after(killed_ms) if g in first_moves else t
        for g, t in resumed.items()
    }

    def worst(games: set[str], times: dict[str, float] = resumed) -> float | None:
        if not games or not games <= set(times):
            return None
        return round(max(times[g] for g in games), 2)

    by_partition: dict[int, float] = {}
    for g in bots & set(resumed):
        by_partition[in_play[g]] = max(by_partition.get(in_play[g], 0.0), resumed[g])
    people = set(in_play) - bots
    return {
        "bot_games_in_play": len(bots),
        "resumed_s": worst(bots),
        "resumed_platform_s": worst(bots, platform),
        "resumed_dead_master_s": worst({g for g in bots if in_play[g] in on_dead}),
        "resumed_survivors_s": worst({g for g in bots if in_play[g] not in on_dead}),
        "bot_games_not_resumed": sorted(bots - set(resumed))[:10],
        "slowest": slowest(bots & set(resumed), resumed, in_play, first_moves, killed_ms),
        "resumed_by_partition_s": {p: round(by_partition[p], 2) for p in sorted(by_partition)},
        "people_games_in_play": len(people),
        "people_resumed_s": max(
            (round(resumed[g], 2) for g in people & set(resumed)), default=None
        ),
    }


def log_time(ms: int) -> str:
    """Wall-clock `ms` as the services' logs write their times (`LOG_FORMAT`'s asctime, its
    date left out): a kill told so is found in their logs (`--keep-logs`)."""
    return time.strftime("%H:%M:%S", time.localtime(ms / 1000)) + f",{ms % 1000:03d}"


def slowest(
    games: set[str], resumed: dict[str, float], in_play: dict[str, int],
    first_moves: dict[str, FirstMove], killed_ms: int,
) -> dict[str, Any] | None:  # fmt: skip
    """The game of `games` that moved again last, its partition, and where its first move
    after the kill waited (None when it ended rather than moved)."""
    if not games:
        return None
    game = max(sorted(games), key=lambda g: resumed[g])
    first = first_moves.get(game)
    where = first.where(killed_ms) if first is not None else {}
    return {"game": game, "partition": in_play[game], "resumed_s": resumed[game], **where}


async def stuck(redis: Client, keys: Keys, games: list[str], since_ms: int) -> dict[str, Any]:
    """Where each of `games` (bot games that did not move again) waits: its log's last
    events (type, seq, ms from `since_ms`), its clocks (member, due ms from `since_ms`), and
    its turns pending in the bot's inbox (consumer, ms idle, deliveries)."""
    if not games:
        return {}
    turns: dict[str, list[Any]] = {}
    for turn, row in await pending_turns(redis, keys, BOT, 1000):
        turns.setdefault(turn.game_id, []).append(
            (as_text(row["consumer"]), row["time_since_delivered"], row["times_delivered"])
        )
    # One pipeline: each game's log tail, each partition's clocks once.
    partitions = sorted({keys.partition(g) for g in games})
    pipe = redis.pipeline(transaction=False)
    for g in games:
        pipe.xrevrange(keys.log(g), count=2)
    for p in partitions:
        pipe.zrange(keys.clocks(p), 0, -1, withscores=True)
    replies: list[Any] = await pipe.execute()
    tails, clocks_of = replies[: len(games)], replies[len(games) :]
    by_partition = dict(zip(partitions, clocks_of, strict=True))
    out: dict[str, Any] = {}
    for g, tail in zip(games, tails, strict=True):
        clocks = by_partition[keys.partition(g)]
        events = [unpack(fields[FIELD_BYTES]) for _, fields in tail]
        out[g] = {
            "partition": keys.partition(g),
            "tail": [(e["type"], e["seq"], e["time"] - since_ms) for e in events],
            "clocks": [
                (as_text(m), int(t) - since_ms) for m, t in clocks if as_text(m).startswith(g)
            ],
            "turns_pending": turns.get(g, []),
        }
    return out


# -- one host count: the measured run ----------------------------------------------------------
@dataclass
class Run:
    """The load on one testbed: a warm-up, the window, and (`kill`) a host's death."""

    bed: Testbed
    seconds: float
    games: int
    say: Callable[[str], None]
    kill: bool = False
    #: the bot games' time per move (s; None: unclocked)
    move_time: float | None = None

    async def go(self) -> dict[str, Any]:
        bed, n = self.bed, self.bed.count
        raise_open_files()
        keys = Keys(prefix=PREFIX)
        redis = await connect(bed.hosts[0].url, socket_timeout=5.0, socket_connect_timeout=2.0)
        if isinstance(redis, AgonCluster):
            redis.takes_over = False  # the services' own clients fail a dead master over
        gateways = Gateways([h.gateway for h in bed.hosts])
        tracker = SeenTracker() if self.kill else Tracker()
        load = Load(
            redis, keys, gateways, self.games * n, PEOPLE_GAMES_PER_HOST * n,
            PEOPLE_MOVES_PER_HOST_S * n, self.move_time,
        )  # fmt: skip
        feeds = Feeds(redis, keys, tracker, load)
        stop = asyncio.Event()
        tasks = [asyncio.create_task(feeds.run(stop)), asyncio.create_task(load.run(stop))]
        try:
            warmup = min(WARMUP_S, self.seconds)
            self.say(
                f"{bed.label}: warming up {warmup:g} s ({load.bot_target} bot games,"
                f" {load.people_target} people's games, {load.rate:g} people's moves/s)"
            )
            await self._sleep(warmup, tasks)
            if not tracker.moves:
                raise ScaleError(f"{bed.label}: no move in {warmup:g} s of warm-up ({bed.dir})")
            row = await self._window(redis, keys, load, tracker, tasks)
            self.say(
                f"{bed.label}: {row['moves_per_sec']:.0f} moves/s, command->event p99"
                f" {row['latency_p99_ms']} ms, CPU per host"
                f" {' '.join(f'{c:.2f}' for c in row['host_cpu_cores'])}"
            )
            if self.kill:
                row["kill"] = await self._kill(redis, keys, load, feeds, tasks)
            row["feed_read_errors"] = dict(feeds.errors)
            return row
        finally:
            stop.set()
            async with _bounded(f"{bed.label}: stopping the load", self.say):
                await load.stop()
                await asyncio.gather(*tasks, return_exceptions=True)
            for task in tasks:
                task.cancel()  # what did not stop in time
            gateways.close()
            async with _bounded(f"{bed.label}: closing the load's Redis client", self.say):
                await redis.aclose()

    async def _sleep(self, seconds: float, tasks: Sequence[asyncio.Task[None]]) -> None:
        """Sleep, raising what a load task died of."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for task in tasks:
                if task.done():
                    task.result()
                    raise ScaleError("a load task ended early")
            await asyncio.sleep(min(0.2, max(0.0, deadline - time.monotonic())))

    async def _window(
        self, redis: Client, keys: Keys, load: Load, tracker: Tracker,
        tasks: Sequence[asyncio.Task[None]],
    ) -> dict[str, Any]:  # fmt: skip
        bed = self.bed
        counts = await engine_counts(redis, keys)
        cpu, throttled, ops = bed.cpu_s(), bed.throttled_s(), bed.commands()
        kinds = bed.cpu_by_kind()
        mine, offered, unserved, acked = (
            time.process_time(),
            load.offered,
            load.unserved,
            len(load.acked),
        )
        t0, began, loadavg = now_ms(), time.perf_counter(), round(os.getloadavg()[0], 2)
        self.say(f"{bed.label}: measuring {self.seconds:g} s")
        await self._sleep(self.seconds, tasks)
        t1, wall = now_ms(), time.perf_counter() - began
        cpu = [(b - a) / wall for a, b in zip(cpu, bed.cpu_s(), strict=True)]
        throttled = [(b - a) / wall for a, b in zip(throttled, bed.throttled_s(), strict=True)]
        ops = bed.commands() - ops
        by_host = [
            {k: (v - was.get(k, 0.0)) / wall for k, v in now.items()}
            for was, now in zip(kinds, bed.cpu_by_kind(), strict=True)
        ]
        counts = await engine_counts(redis, keys) - counts
        moves = [(ms, lat) for ms, lat in tracker.moves if t0 <= ms < t1]
        latencies = [float(lat) for _, lat in moves]
        span = (t1 - t0) / 1000
        return {
            "name": bed.label,
            "hosts": bed.count,
            "cpu_quota": bed.cpu if bed.lab.cgroups else None,
            "replicas": bed.replicas,
            "seconds": round(span, 2),
            "moves": len(moves),
            "moves_per_sec": round(len(moves) / span, 1),
            "games_ended": sum(1 for ms, _ in tracker.ended if t0 <= ms < t1),
            "latency_p50_ms": quantile(latencies, 0.5) if latencies else None,
            "latency_p99_ms": quantile(latencies, 0.99) if latencies else None,
            "engine_moves": counts["moves"],
            "engine_conflicts": counts["conflicts"],
            "conflicts_per_1k_moves": round(
                1000 * counts["conflicts"] / max(1, counts["moves"]), 1
            ),
            "redis_ops_per_move": round(ops / len(moves), 1) if moves else None,
            "host_cpu_cores": [round(c, 3) for c in cpu],
            "host_throttled": [round(t, 3) for t in throttled],
            # cores per kind of process, summed over the hosts (engine, ..., redis master)
            "cpu_by_kind": {
                k: round(sum(h.get(k, 0.0) for h in by_host), 3)
                for k in sorted({k for h in by_host for k in h})
            },
            # the same per host: where one host's share of the work is larger
            "cpu_by_host": [{k: round(v, 3) for k, v in sorted(h.items())} for h in by_host],
            "loadgen_cores": round((time.process_time() - mine) / wall, 3),
            "load_average_before": loadavg,
            "people": {
                "offered": load.offered - offered,
                "unserved": load.unserved - unserved,
                "acknowledged": len(load.acked) - acked,
            },
            "outcomes": dict(load.outcomes),
            "feed_events_missed": tracker.missed,
            "feed_events_filled": tracker.filled,
        }

    async def _kill(
        self, redis: Client, keys: Keys, load: Load, feeds: Feeds,
        tasks: Sequence[asyncio.Task[None]],
    ) -> dict[str, Any]:  # fmt: skip
        bed = self.bed
        victim = bed.hosts[-1]
        dead = victim.master
        lo, hi = bed.slot_ranges[victim.index]
        on_dead = {p for p in keys.all_partitions() if lo <= key_slot(keys.feed(p).encode()) <= hi}
        in_play = {g: p for g, (p, ms) in feeds.moving.items() if ms >= now_ms() - IN_PLAY_MS}
        bots = {g for g in in_play if g in load.bots}
        processes = len(victim.pids())
        killed_ms = feeds.since = now_ms()
        began = time.monotonic()
        bed.kill(victim)
        load.gateways.drop(victim.gateway)
        link = "link down, " if victim.netns else "no link to take down (loopback), "
        at = log_time(killed_ms)
        self.say(
            f"{bed.label}: killed {victim.name} at {at} ({link}{processes} processes SIGKILLed)"
        )
        served_s = None
        while time.monotonic() - began < RESUME_TIMEOUT_S:
            if served_s is None and bed.slots_served_without(dead):
                served_s = round(time.monotonic() - began, 2)
            resumed = resumption(
                in_play, bots, feeds.next_after, killed_ms, on_dead, feeds.ended_at,
                feeds.first_moves,
            )  # fmt: skip
            if served_s is not None and not resumed["bot_games_not_resumed"]:
                break
            await asyncio.sleep(0.05)
        report: dict[str, Any] = {
            "host": victim.name,
            "killed_at": at,
            "slots_served_s": served_s,
            **resumed,
        }
        report["stuck"] = await stuck(redis, keys, resumed["bot_games_not_resumed"], killed_ms)
        self.say(
            f"{bed.label}: slots served again after {served_s} s, every bot game in play"
            f" ({report['bot_games_in_play']}) moved again after {report['resumed_s']} s"
        )
        before = len(feeds.tracker.moves)
        await self._sleep(AFTER_KILL_S, tasks)
        report["moves_per_sec_after"] = round((len(feeds.tracker.moves) - before) / AFTER_KILL_S, 1)
        load.replacing = False
        self.say(f"{bed.label}: no new games; waiting for the {load.live} live ones to end")
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while load.live and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        report["games_live_at_end"] = load.live
        report["settled"] = await _settled(redis, keys)
        report.update(await audit(redis, keys, load, feeds.tracker))
        report["verify"] = await verify(bed.hosts[0].url)
        self.say(
            f"{bed.label}: lost {report['acked_lost']}, doubled {report['doubled']}, every game"
            f" ended: {report['every_game_ended']} ({report['time_forfeits']} lost on time),"
            f" verify {report['verify']['summary']}"
        )
        return report


@contextlib.asynccontextmanager
async def _bounded(what: str, say: Callable[[str], None]) -> AsyncIterator[None]:
    """At most `CLEANUP_S` for a step of a run's cleanup: one that takes longer is given up,
    with what every task then waited on (once, in a CI run, the cleanup never ended)."""
    try:
        async with asyncio.timeout(CLEANUP_S):
            yield
    except TimeoutError:
        waiting = []
        for task in asyncio.all_tasks():
            frames = task.get_stack()
            if task is not asyncio.current_task() and frames:
                where = frames[-1]
                waiting.append(
                    f"{where.f_code.co_name} ({where.f_code.co_filename}:{where.f_lineno})"
                )
        say(f"{what}: given up after {CLEANUP_S:g} s; tasks waiting: {'; '.join(waiting)}")


async def _settled(redis: Client, keys: Keys, timeout_s: float = 60.0) -> bool:
    """Whether every group's lag and pending came to 0 (twice in a row) in time."""
    quiet, deadline = 0, time.monotonic() + timeout_s
    while quiet < 2 and time.monotonic() < deadline:
        busy = any(sum(v) for v in (await group_lag(redis, keys)).values())
        quiet = 0 if busy else quiet + 1
        await asyncio.sleep(0.2)
    return quiet >= 2


async def audit(redis: Client, keys: Keys, load: Load, tracker: Tracker) -> dict[str, Any]:
    """Every game's log against what was acknowledged and seen: each move a gateway accepted
    is in its log at its seq, each event seen on a feed is still there, no ply twice, no
    gap, every game ended."""
    seen = tracker.seen if isinstance(tracker, SeenTracker) else {}
    games = sorted(set(load.created) | {g for g, _ in seen})
    logged: dict[tuple[str, int], dict[str, Any]] = {}
    gaps = doubled = unended = missing = 0
    endings: Counter[str] = Counter()
    open_ids: list[str] = []
    known = set(load.created)
    orphans: list[str] = []
    for lo in range(0, len(games), 200):
        chunk = games[lo : lo + 200]
        pipe = redis.pipeline(transaction=False)
        for game_id in chunk:
            pipe.xrange(keys.log(game_id))
        for game_id, rows in zip(chunk, await pipe.execute(), strict=True):
            events = [(e.seq, unpack(e.data)) for e in log_entries(rows)]
            if not events:
                missing += 1
                continue
            gaps += [s for s, _ in events] != list(range(1, len(events) + 1))
            plies = Counter(ev["ply"] for _, ev in events if ev["type"] == "move_played")
            doubled += sum(c - 1 for c in plies.values())
            if events[-1][1]["type"] == "game_ended":
                endings[str(events[-1][1].get("reason"))] += 1
            else:
                # A people's game whose creation answer the client never got (its gateway
                # died mid-request): nobody holds its tokens, it ends when abandoned.
                seats = events[0][1].get("seats", [])
                if game_id not in known and all(s.get("kind") == "human" for s in seats):
                    orphans.append(game_id)
                else:
                    unended += 1
                    open_ids.append(game_id)
            logged.update(((game_id, s), ev) for s, ev in events)

    def moved(game_id: str, seq: int, move: str) -> bool:
        ev = logged.get((game_id, seq))
        return ev is not None and ev["type"] == "move_played" and ev["move"] == move

    def kept(key: tuple[str, int], kind: str, at: int) -> bool:
        ev = logged.get(key)
        return ev is not None and ev["type"] == kind and int(ev["time"]) == at

    return {
        "games": len(games),
        "acked_moves": len(load.acked),
        "acked_lost": sum(not moved(*a) for a in load.acked),
        "seen_events": len(seen),
        "seen_lost": sum(not kept(key, *v) for key, v in seen.items()),
        "doubled": doubled,
        "logs_with_gaps": gaps,
        "logs_missing": missing,
        "games_not_ended": unended,
        "games_not_ended_ids": open_ids[:10],
        "people_games_unanswered": len(orphans),
        "people_games_unanswered_ids": orphans[:10],
        "time_forfeits": endings["time_forfeit"],
        "endings": dict(endings),
        "every_game_ended": unended == 0 and missing == 0,
    }


async def verify(url: str) -> dict[str, Any]:
    """`agon verify` against the cluster: its verdict, and its one-line summary."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.cli", "verify", "--redis-url", url, "--prefix", PREFIX,
        "--json", "--wait-s", "30",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(process.communicate(), VERIFY_TIMEOUT_S)
    except TimeoutError:
        process.kill()
        await process.wait()
        return {"ok": False, "summary": f"no verdict in {VERIFY_TIMEOUT_S:g} s"}
    try:
        report = json.loads(out.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        last = (err.decode().strip().splitlines() or ["no output"])[-1]
        return {"ok": False, "summary": f"exit {process.returncode}: {last[:200]}"}
    problems = report.get("problems") or []
    verdict = "OK" if report.get("ok") else f"{len(problems)} problem(s): {problems[:3]}"
    summary = f"{verdict} ({report.get('games')} games, {report.get('events')} events)"
    return {"ok": bool(report.get("ok")), "summary": summary}


# -- the whole run -----------------------------------------------------------------------------
def _interrupted(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run_scale_bench(
    hosts: str = DEFAULT_HOSTS,
    cpu: float = DEFAULT_CPU,
    seconds: float = 10.0,
    kill_host: bool = False,
    games: int = BOT_GAMES_PER_HOST,
    say: Callable[[str], None] | None = None,
    keep_logs: bool = False,
    move_time: float | None = None,
    repeat: int = 1,
    pace_ms: int = 0,
) -> list[dict[str, Any]]:
    """A row per window (`repeat` per host count, taken in turn; then one for the kill), with
    `repeat` > 1 a row of medians per host count, then a row about the run ("name": "run").
    Each efficiency is against the median one-host throughput (this machine's one-host
    windows vary by 10%: one alone sets every host count's efficiency). `pace_ms`: the
    bots answer no sooner (`agon bots --pace-ms`), so that a load can leave hosts room."""
    counts = parse_counts(hosts, "--hosts")
    if not cpu > 0:
        raise UsageError(f"--cpu wants cores per host > 0, e.g. 0.2; got {cpu:g}")
    if not seconds > 0:
        raise UsageError(f"--seconds wants a number > 0, got {seconds:g}")
    if games < 1:
        raise UsageError(f"--games wants a whole number ≥ 1, got {games}")
    if move_time is not None and not move_time > 0:
        raise UsageError(f"--move-time wants seconds > 0, e.g. 2; got {move_time:g}")
    if repeat < 1:
        raise UsageError(f"--repeat wants a whole number ≥ 1, got {repeat}")
    if pace_ms < 0:
        raise UsageError(f"--pace-ms wants milliseconds ≥ 0, got {pace_ms}")
    if kill_host and max(counts) < 3:
        raise UsageError("--kill-host needs 3 hosts or more (each master keeps a replica)")
    say = say or Say()
    lab = Lab.probe()
    for note in lab.notes:
        say(note)
    rows: list[dict[str, Any]] = []
    logs: list[str] = []
    runs = [(n, False) for _ in range(repeat) for n in counts]
    runs += [(max(counts), True)] if kill_host else []
    with one_at_a_time():
        if stale := lab.clean():
            say(f"removed what an earlier run left: {', '.join(stale)}")
        previous = signal.signal(signal.SIGTERM, _interrupted)
        try:
            for n, kill in runs:
                with Testbed(lab, n, cpu, 2 if kill else 1, say, keep_logs, pace_ms) as bed:
                    bed.start()
                    row = asyncio.run(Run(bed, seconds, games, say, kill, move_time).go())
                    row["process_errors"] = bed.errors()
                    if kill:
                        row["name"] += ", one killed"
                    elif repeat > 1:
                        row["name"] += f", window {sum(r['hosts'] == n for r in rows) + 1}"
                    rows.append(row)
                if bed.keep_logs:
                    logs += [str(bed.dir), *(str(h.fleet.dir) for h in bed.hosts if h.fleet)]
                say(f"{bed.label}: cleaned up")
        finally:
            signal.signal(signal.SIGTERM, previous)
            left = lab.leftovers()
            lab.clean()
    rows += with_efficiency([r for r in rows if "kill" not in r], repeat)
    rows.append(
        {
            "name": "run",
            "cores": os.cpu_count(),
            "layout": "network namespaces" if lab.namespaces else "loopback",
            "quotas": lab.cgroups,
            "notes": list(lab.notes),
            "game": GAME,
            "games_per_host": games,
            "people_games_per_host": PEOPLE_GAMES_PER_HOST,
            "people_moves_per_host_s": PEOPLE_MOVES_PER_HOST_S,
            "bot_pace_ms": pace_ms,
            "left_after_cleanup": left,
            "logs": logs,
        }
    )
    return rows


#: The figures of a host count's windows whose median its summary row gives.
MEDIANS = ("moves_per_sec", "latency_p50_ms", "latency_p99_ms", "conflicts_per_1k_moves",
           "redis_ops_per_move", "loadgen_cores", "load_average_before")  # fmt: skip


def with_efficiency(curve: list[dict[str, Any]], repeat: int) -> list[dict[str, Any]]:
    """Set each window's efficiency against the median throughput per host of the fewest
    hosts' windows; with `repeat` > 1, the summary rows: each host count's medians (a
    host's CPU and throttling too, host by host) and the efficiency of its median."""
    by_count: dict[int, list[dict[str, Any]]] = {}
    for r in curve:
        by_count.setdefault(r["hosts"], []).append(r)
    if not by_count:
        return []
    fewest = min(by_count)
    per_host = statistics.median([r["moves_per_sec"] for r in by_count[fewest]]) / fewest

    def efficiency(moves: float, hosts: int) -> float | None:
        return round(moves / (hosts * per_host), 3) if per_host else None

    for r in curve:
        r["efficiency"] = efficiency(r["moves_per_sec"], r["hosts"])
    if repeat < 2:
        return []
    summaries = []
    for hosts, windows in sorted(by_count.items()):
        label = windows[0]["name"].split(",")[0]
        row: dict[str, Any] = {
            "name": f"{label}, median of {len(windows)}",
            "hosts": hosts,
            "cpu_quota": windows[0]["cpu_quota"],
            "summary": True,
        }
        for key in MEDIANS:
            values = [w[key] for w in windows if w.get(key) is not None]
            row[key] = statistics.median(values) if values else None
        for key in ("host_cpu_cores", "host_throttled"):
            hosts_of = zip(*(w[key] for w in windows), strict=True)
            row[key] = [statistics.median(values) for values in hosts_of]
        people = ("acknowledged", "offered")
        row["people"] = {k: statistics.median(w["people"][k] for w in windows) for k in people}
        row["efficiency"] = efficiency(row["moves_per_sec"], hosts)
        summaries.append(row)
    return summaries


# -- the report --------------------------------------------------------------------------------
def told_slowest(game: dict[str, Any] | None) -> str:
    """The slowest game's wait, told (empty when it ended rather than moved)."""
    if not game or "turn_given_s" not in game:
        return ""
    return (
        f" the slowest (partition {game['partition']}) was given its turn at"
        f" {game['turn_given_s']:+.2f} s, delivered {game['delivered_after_s']:.2f} s later,"
        f" its move sent {game['sent_after_s']:.2f} s later and played"
        f" {game['played_after_s']:.2f} s later;"
    )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def print_scale_table(rows: Sequence[dict[str, Any]]) -> None:
    runs = [r for r in rows if r["name"] != "run"]
    windows = [r for r in runs if not r.get("summary")]
    run_row = next((r for r in rows if r["name"] == "run"), {})
    if not runs:
        return
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)  # piped: rich's 80 columns would wrap every cell
    quota = runs[0]["cpu_quota"]
    title = (
        f"scale: {run_row.get('layout')}, {f'{quota:g} cores a host' if quota else 'no quota'},"
        f" {run_row.get('games_per_host')} bot games + {run_row.get('people_games_per_host')}"
        f" people's games a host"
    )
    table = Table(title=title)
    columns = ("hosts", "moves/s", "per host", "efficiency", "cmd→event p50 / p99 ms",
               "conflicts / 1k moves", "Redis ops / move", "CPU per host, cores",
               "people's moves acked / offered")  # fmt: skip
    for i, column in enumerate(columns):
        table.add_column(column, justify="left" if i == 0 else "right")
    for r in runs:
        people = r["people"]
        table.add_row(
            r["name"],
            f"{r['moves_per_sec']:.0f}",
            f"{r['moves_per_sec'] / r['hosts']:.0f}",
            "-" if r.get("efficiency") is None else f"{r['efficiency']:.2f}",
            f"{_ms(r['latency_p50_ms'])} / {_ms(r['latency_p99_ms'])}",
            f"{r['conflicts_per_1k_moves']:.0f}",
            _ms(r["redis_ops_per_move"]),
            " ".join(f"{c:.2f}" for c in r["host_cpu_cores"]),
            f"{people['acknowledged']} / {people['offered']}",
        )
    console.print(table)
    lines = [
        "moves/s: MovePlayed entries on the feeds over the window; per host: / hosts;"
        " efficiency: moves/s(N) / (N x moves/s(1), the median of its windows); cmd→event:"
        " the command's XADD to its MovePlayed's (Redis clock); conflicts: the engines'"
        " appends that lost a race;"
        " Redis ops: total_commands_processed over every master; CPU: each host's"
        f" {'cgroup (cpuacct)' if run_row.get('quotas') else 'processes'} over the window.",
        f"{run_row.get('cores')} cores; the load generator (outside the quotas) used"
        f" {', '.join(format(r['loadgen_cores'], '.2f') for r in windows)} cores; the machine's"
        " load average before each window"
        f" {', '.join(str(r['load_average_before']) for r in windows)}"
        " (other work on it shows there).",
    ]
    for r in windows:
        used = sum(r["host_cpu_cores"]) / len(r["host_cpu_cores"])
        if r["cpu_quota"] and used < QUOTA_BOUND * r["cpu_quota"]:
            lines.append(
                f"{r['name']}: the hosts used {used:.2f} of their {r['cpu_quota']:g} cores"
                f" (throttled {max(r['host_throttled']):.2f} s a second at most): the quota"
                " was not the limit; the load offered was (bots paced, people's moves at a"
                " fixed rate), or the machine (its load average before:"
                f" {r['load_average_before']}; then the figures are not the design's)."
            )
        if "kill" in r:
            k = r["kill"]
            lines.append(
                f"{r['name']} ({k['host']}): slots served again after {k['slots_served_s']} s;"
                f" every bot game in play ({k['bot_games_in_play']}) moved again after"
                f" {k['resumed_s']} s (on the dead master {k['resumed_dead_master_s']} s, on"
                f" the survivors {k['resumed_survivors_s']} s; the platform's part, less each"
                f" bot's think time, {k.get('resumed_platform_s')} s);"
                f" {k['moves_per_sec_after']:.0f}"
                f" moves/s after;{told_slowest(k.get('slowest'))}"
                f" acknowledged moves lost {k['acked_lost']} of {k['acked_moves']}, feed events"
                f" lost {k['seen_lost']} of {k['seen_events']}, doubled {k['doubled']}; every"
                f" game ended: {k['every_game_ended']} ({k['time_forfeits']} lost on time);"
                f" verify {k['verify']['summary']}"
            )
        if r.get("process_errors"):
            lines.append(f"{r['name']}: a process logged errors: {r['process_errors']}")
    lines += [f"note: {n}" for n in run_row.get("notes", ())]
    if run_row.get("left_after_cleanup"):
        lines.append(f"left after cleanup (then removed): {run_row['left_after_cleanup']}")
    if run_row.get("logs"):
        lines.append(f"logs kept: {', '.join(run_row['logs'])}")
    for line in lines:
        console.print(line, highlight=False, markup=False, soft_wrap=True)
