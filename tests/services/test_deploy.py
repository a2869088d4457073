"""deploy/: the compose files, the Redis configs and the systemd units are well-formed, and the
compose layout, started as plain `agon` processes, plays games.

The layout test reads deploy/compose.yaml (each service's command and replicas), runs that
many of each as processes against a redis-server started with deploy/redis.conf (AOF on;
the ACL file is another test's business), waits for their ready lines, and plays through
them: games created over a gateway's HTTP API (bots against bots, and a seat moved over
HTTP) watched live over WebSockets on both gateways, a round robin played by the directors;
then the compose health checks pass, `agon status` lists every process and group, `agon
verify` passes, and SIGTERM ends every process cleanly. The other tests check the files:
restart policies and health checks everywhere, every command an `agon` command that parses,
the cluster variant's six nodes and its create job, the units' instances, and no secret.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis as redis_sync
import redis.asyncio as aioredis
import yaml

from bots import bot_names
from schemas.api import decode_server_message
from services.bus.embedded import find_redis_server, free_port
from services.bus.keys import Keys
from services.bus.ownership import share
from services.cli import build_parser
from services.tournament.store import TournamentStore
from tests.services.test_operability import READY_S, STOP_S, Agon, is_ready

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
#: The services of the layout, each an `agon` command.
SERVICES = ("engine", "projector", "dispatcher", "bots", "gateway", "director")
#: The commands' environment: only what the compose files give them.
ENV = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "AGON_SECRET")}
#: How long the whole layout may take to say it is ready.
START_S = 120.0

pytestmark = pytest.mark.timeout(240)


def compose(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((DEPLOY / name).read_text())
    return doc


def agon_services(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The services that run the `agon` image (its entrypoint is `agon`)."""
    return {n: s for n, s in doc["services"].items() if s.get("image") == "agon:local"}


def layout(doc: dict[str, Any]) -> list[tuple[str, list[str], int]]:
    """(service, its `agon` arguments, replicas) of every long-running agon service."""
    return [
        (name, list(s["command"]), int(s.get("deploy", {}).get("replicas", 1)))
        for name, s in agon_services(doc).items()
        if not s.get("profiles")
    ]


def parses(argv: list[str]) -> None:
    """`argv` is an `agon` command line that `agon` accepts."""
    parser, module = build_parser(argv[0])
    assert module is not None, f"not an agon command: {argv}"
    try:
        parser.parse_args(argv)
    except SystemExit as exc:
        raise AssertionError(f"agon rejects {argv}") from exc


# -- the files ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["compose.yaml", "compose.cluster.yaml"])
def test_a_compose_file_restarts_and_checks_every_service(name: str) -> None:
    doc = compose(name)
    assert "agon acl --out deploy/secrets" in (DEPLOY / name).read_text().split("\nname:")[0]
    for svc, spec in doc["services"].items():
        restart = spec.get("restart")
        assert restart in ("always", "unless-stopped", "on-failure", "no"), svc
        if restart == "no":  # one-shot: the cluster's create job, the operator's commands
            continue
        check = spec.get("healthcheck", {})
        assert check.get("test") and not check.get("disable"), f"{svc} has no health check"
        if check["test"][:2] == ["CMD", "agon"]:
            parses(check["test"][2:])
        # Every file mounted from deploy/ exists, but the generated secrets.
        for volume in spec.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./") and not source.startswith("./secrets/"):
                assert (DEPLOY / source).is_file(), f"{svc} mounts a missing {source}"
    services = agon_services(doc)
    assert {svc for svc, _, _ in layout(doc)} == set(SERVICES)
    for svc, argv, replicas in layout(doc):
        assert argv[0] == svc and replicas >= 1
        parses(argv)
        assert services[svc]["env_file"] == [
            {"path": f"secrets/{svc}.env"},
            {"path": f"env/{svc}.env", "required": False},
        ]
        assert (DEPLOY / "env" / f"{svc}.env.example").is_file()
    gateway = services["gateway"]
    port = gateway["command"][gateway["command"].index("--port") + 1]
    assert f"127.0.0.1:{port}/health" in " ".join(gateway["healthcheck"]["test"])
    operator = services["operator"]
    assert operator["env_file"] == [{"path": "secrets/operator.env"}]
    parses(operator["command"])


def test_redis_reads_the_acl_file_that_agon_acl_writes() -> None:
    conf = (DEPLOY / "redis.conf").read_text()
    (aclfile,) = re.findall(r"^aclfile\s+(\S+)$", conf, re.M)
    for name in ("compose.yaml", "compose.cluster.yaml"):
        nodes = [s for s in compose(name)["services"].values() if "redis.conf" in str(s)]
        assert len(nodes) == (1 if name == "compose.yaml" else 6)
        for node in nodes:  # the private file, copied for the redis user to the configured path
            assert "./secrets/users.acl:/run/agon/users.acl:ro" in node["volumes"]
            assert f"/run/agon/users.acl {aclfile}\n" in node["entrypoint"][-1]
    assert re.search(r"^appendonly yes$", conf, re.M) and "maxmemory-policy noeviction" in conf


def test_the_cluster_variant_has_six_nodes_a_create_job_and_the_same_services() -> None:
    doc = compose("compose.cluster.yaml")
    services = doc["services"]
    nodes = {n: s for n, s in services.items() if re.fullmatch(r"redis-\d+", n)}
    job = services["cluster-create"]
    script = job["entrypoint"][-1]
    (replicas,) = re.findall(r"--cluster-replicas (\d+)", script)
    (joined,) = re.findall(r"for n in ([\d ]+); do\n\s*nodes=", script)
    assert len(nodes) == 6 and int(replicas) == 1
    assert sorted(nodes) == [f"redis-{n}" for n in joined.split()]  # every node joined
    assert "--cluster create $$nodes" in script and job["restart"] == "no"
    assert job["depends_on"] == {n: {"condition": "service_healthy"} for n in nodes}
    for name, node in nodes.items():
        assert node["environment"] == {"NODE": name}
        assert "redis-server /etc/redis/redis-cluster.conf" in node["entrypoint"][-1]
        assert f"{name}:/data" in node["volumes"]
        assert "./redis-cluster.conf:/etc/redis/redis-cluster.conf:ro" in node["volumes"]
    assert nodes["redis-1"]["networks"]["default"]["aliases"] == ["redis"]
    # The services are those of compose.yaml, started once the cluster is formed; engines
    # there reply, and projectors, dispatchers and bot workers acknowledge, only once a
    # replica holds what they wrote (deploy/README.md, Promises).
    single = agon_services(compose("compose.yaml"))
    for svc in ("engine", "projector", "dispatcher", "bots"):
        single[svc]["command"] = [*single[svc]["command"], "--ack-replicas", "1"]
    for svc, spec in agon_services(doc).items():
        if svc != "operator":
            wait = {"cluster-create": {"condition": "service_completed_successfully"}}
            assert spec["depends_on"] == wait, svc
        assert {**spec, "depends_on": None} == {**single[svc], "depends_on": None}, svc


@contextlib.contextmanager
def redis_with(conf: Path, directory: Path, *args: str) -> Iterator[redis_sync.Redis]:
    """A redis-server run with `conf` (and `args` after it) in `directory`, until the end."""
    port = free_port()
    log = directory / "redis.log"
    proc = subprocess.Popen(
        [find_redis_server(), str(conf), "--port", str(port), "--bind", "127.0.0.1",
         "--logfile", str(log), *args],
        cwd=directory, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    client = redis_sync.Redis(port=port, decode_responses=True)
    try:
        deadline = time.monotonic() + 10
        while True:
            assert proc.poll() is None, f"redis-server refused {conf}: {log.read_text()[-500:]}"
            with contextlib.suppress(redis_sync.ConnectionError):
                if client.ping():
                    break
            assert time.monotonic() < deadline, "redis-server did not answer"
            time.sleep(0.05)
        yield client
    finally:
        client.close()
        proc.terminate()
        proc.wait(10)


def test_the_redis_configs_load(tmp_path: Path) -> None:
    # The ACL file is written by `agon acl` at deploy time; here Redis runs without one.
    single = tmp_path / "single"
    single.mkdir()
    with redis_with(DEPLOY / "redis.conf", single, "--aclfile", "") as r:
        got = {k: r.config_get(k)[k] for k in ("appendonly", "appendfsync", "maxmemory-policy")}
        assert got == {
            "appendonly": "yes",
            "appendfsync": "everysec",
            "maxmemory-policy": "noeviction",
        }
        r.set("x", "1")
    assert (single / "appendonlydir").is_dir()  # the AOF is where compose keeps its volume
    # A cluster node: its include names the container's path of redis.conf.
    text = (DEPLOY / "redis-cluster.conf").read_text()
    assert re.findall(r"^include (\S+)$", text, re.M) == ["/etc/redis/redis.conf"]
    node = tmp_path / "node"
    node.mkdir()
    conf = node / "redis-cluster.conf"
    conf.write_text(text.replace("/etc/redis/redis.conf", str(DEPLOY / "redis.conf")))
    # (The cluster bus port, 10000 above the port by default, may not exist above a high one.)
    bus = ("--cluster-port", str(free_port()), "--cluster-announce-hostname", "redis-1")
    with redis_with(conf, node, "--aclfile", "", *bus) as r:
        assert r.info("cluster")["cluster_enabled"] == 1
        assert r.config_get("appendonly")["appendonly"] == "yes"
        endpoint = r.config_get("cluster-preferred-endpoint-type")
        assert endpoint["cluster-preferred-endpoint-type"] == "hostname"


def unit(svc: str) -> dict[str, list[tuple[str, str]]]:
    """A systemd unit's sections as (key, value) lists, in order."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] = []
    for line in (DEPLOY / "systemd" / f"agon-{svc}@.service").read_text().splitlines():
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), [])
        elif line and not line.startswith("#"):
            key, _, value = line.partition("=")
            current.append((key, value))
    return sections


def test_the_systemd_units_run_one_agon_command_per_instance() -> None:
    commands = {svc: argv for svc, argv, _ in layout(compose("compose.yaml"))}
    shared: list[tuple[str, str]] | None = None
    for svc in SERVICES:
        u = unit(svc)
        service = dict(u["Service"])
        binary, *argv = service["ExecStart"].split()
        assert binary == "/opt/agon/.venv/bin/agon" and argv[0] == svc
        parses([a.replace("%i", "8080") for a in argv])
        if svc == "gateway":  # one per port, the instance
            assert argv[argv.index("--port") + 1] == "%i"
        else:
            assert argv == commands[svc]
        files = [v for k, v in u["Service"] if k == "EnvironmentFile"]
        assert files == [f"/etc/agon/secrets/{svc}.env", f"-/etc/agon/env/{svc}.env"]
        assert service["Restart"] == "always" and dict(u["Install"])["WantedBy"] == "agon.target"
        assert dict(u["Unit"])["PartOf"] == "agon.target"
        rest = [(k, v) for k, v in u["Service"] if k not in ("ExecStart", "EnvironmentFile")]
        assert shared is None or rest == shared, f"agon-{svc}@ differs from the others"
        shared = rest
    assert (DEPLOY / "systemd" / "agon.target").is_file()


def test_systemd_accepts_the_units(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (outside the project)")
    agon = Path(sys.executable).parent / "agon"
    instances = []
    for svc in SERVICES:
        text = (DEPLOY / "systemd" / f"agon-{svc}@.service").read_text()
        text = text.replace("/opt/agon/.venv/bin/agon", str(agon))  # this checkout's
        (tmp_path / f"agon-{svc}@.service").write_text(text)
        instance = tmp_path / f"agon-{svc}@{8080 if svc == 'gateway' else 1}.service"
        instance.write_text(text)
        instances.append(str(instance))
    shutil.copy(DEPLOY / "systemd" / "agon.target", tmp_path)
    done = subprocess.run(
        [analyze, "verify", "--man=no", *instances, str(tmp_path / "agon.target")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0 and str(tmp_path) not in done.stderr, done.stderr


def test_no_secret_is_written_in_deploy() -> None:
    fixed = [
        re.compile(r"redis://[^:/@\s]+:(?!<password>)[^@\s$]+@"),  # a password in a URL
        re.compile(r"^\s*(AGON_SECRET|REDIS_URL)=\S", re.M),  # a value in an env file
        re.compile(r"^\s*(requirepass|masterauth)\s+\S", re.M),  # a Redis password line
        re.compile(r"^\s*user\s.*\s>\S", re.M),  # an ACL user with a password
    ]
    files = [p for p in DEPLOY.rglob("*") if p.is_file() and "secrets" not in p.parts]
    assert len(files) >= 15
    for path in files:
        text = path.read_text()
        for pattern in fixed:
            assert not pattern.search(text), f"deploy/{path.relative_to(DEPLOY)}: {pattern.pattern}"


def test_directors_share_the_tournaments_out() -> None:
    ids = [f"t{i}" for i in range(200)]
    three = ["director-a", "director-b", "director-c"]
    shares = {d: share(ids, three, d) for d in three}
    assert sorted(t for mine in shares.values() for t in mine) == sorted(ids)  # each once
    assert all(len(mine) > 30 for mine in shares.values()), {d: len(m) for d, m in shares.items()}
    # When one goes, only its tournaments move.
    two = three[1:]
    for d in two:
        assert set(shares[d]) <= set(share(ids, two, d))


# -- the layout, as processes -----------------------------------------------------------------
def _start(doc: dict[str, Any], env: dict[str, str]) -> tuple[list[tuple[str, Agon]], list[str]]:
    """Every replica of every service of the layout; the gateways' URLs."""
    procs: list[tuple[str, Agon]] = []
    gateways: list[str] = []
    for svc, argv, replicas in layout(doc):
        for _ in range(replicas):
            args = list(argv)
            if svc == "gateway":  # each on a free port of the loopback
                port = free_port()
                args[args.index("--host") + 1] = "127.0.0.1"
                args[args.index("--port") + 1] = str(port)
                gateways.append(f"http://127.0.0.1:{port}")
            procs.append((svc, Agon(*args, env=env)))
    return procs, gateways


def _ready(svc: str, process: Agon, timeout_s: float) -> bool:
    if svc == "gateway":
        return process.wait_for(lambda x: "serving" in x, timeout_s, "stdout") is not None
    return process.wait_for(is_ready, timeout_s) is not None


async def _json(response: aiohttp.ClientResponse, status: int = 200) -> Any:
    assert response.status == status, await response.text()
    return await response.json()


async def _events(ws: aiohttp.ClientWebSocketResponse) -> list[tuple[int, float]]:
    """(seq, arrival time) of every event on a game socket, until the game ends."""
    got = []
    async for msg in ws:
        m = decode_server_message(msg.data)
        if m.type == "event":
            got.append((m.seq, time.monotonic()))
            if m.event["type"] == "game_ended":
                return got
    raise AssertionError(f"the socket closed before the game ended: {got}")


async def _play_seat(
    http: aiohttp.ClientSession, base: str, gid: str, token: str
) -> dict[int, float]:
    """Play seat 1's first legal move until the game ends; when each move was logged."""
    logged: dict[int, float] = {}
    while True:
        v = await _json(await http.get(f"{base}/api/games/{gid}"))
        if v["status"] == "ended":
            return logged
        if v["to_move"] != 1:
            await asyncio.sleep(0.02)
            continue
        body = {"move": v["legal_moves"][0], "seq": v["seq"], "token": token}
        reply = await _json(await http.post(f"{base}/api/games/{gid}/moves", json=body))
        logged[reply["seq"]] = time.monotonic()


async def _until_ended(http: aiohttp.ClientSession, base: str, gid: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        v: dict[str, Any] = await _json(await http.get(f"{base}/api/games/{gid}"))
        if v["status"] == "ended":
            return v
        await asyncio.sleep(0.1)
    raise AssertionError(f"game {gid} did not end")


def _agon(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services.cli", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


async def test_the_compose_layout_plays_games_as_plain_processes(tmp_path: Path) -> None:
    doc = compose("compose.yaml")
    replicas = {svc: n for svc, _, n in layout(doc)}
    assert replicas["engine"] >= 2 and replicas["gateway"] >= 2 and replicas["director"] >= 2
    with redis_with(DEPLOY / "redis.conf", tmp_path, "--aclfile", "") as server:
        url = f"redis://127.0.0.1:{server.connection_pool.connection_kwargs['port']}/0"
        env = {**ENV, "REDIS_URL": url}  # what each container's env file gives it
        procs, gateways = _start(doc, env)
        try:
            # Ten interpreters start at once on a small machine: give them all a while.
            deadline = time.monotonic() + START_S
            for svc, process in procs:
                left = max(READY_S, deadline - time.monotonic())
                assert _ready(svc, process, left), f"{svc} not ready:\n{process.text()}"
            await _play_through(env, url, gateways)
            # The compose health checks pass: each service's and each gateway's.
            checks = {
                tuple(s["healthcheck"]["test"]) for s in agon_services(doc).values()
                if "healthcheck" in s and not s["healthcheck"].get("disable")
            }  # fmt: skip
            for test in checks:
                for base in gateways if "health" in " ".join(test) else [""]:
                    argv = [a.replace("http://127.0.0.1:8080", base) for a in test[1:]]
                    if argv[0] == "agon":
                        argv = [sys.executable, "-m", "services.cli", *argv[1:]]
                    else:
                        argv[0] = sys.executable  # `python` in the image
                    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, timeout=60)
                    assert done.returncode == 0, (test, done.stderr)
            status = _agon(env, "status", "--json")
            assert status.returncode == 0, status.stderr
            _check_status(json.loads(status.stdout), replicas)
            verify = _agon(env, "verify")
            assert verify.returncode == 0 and verify.stdout.rstrip().endswith("OK"), verify
            asked = time.monotonic()
            for _, process in procs:
                process.proc.send_signal(signal.SIGTERM)
            for svc, process in procs:
                left = asked + STOP_S - time.monotonic()
                assert process.wait(max(left, 0.1)) == 0, f"{svc} after SIGTERM:\n{process.text()}"
                assert "Traceback" not in process.text() + process.text("stdout"), process.text()
            after = _agon(env, "status", "--json")
            assert json.loads(after.stdout)["processes"] == []  # each left its heartbeat
        finally:
            for _, process in procs:
                process.close()


async def _play_through(env: dict[str, str], url: str, gateways: list[str]) -> None:
    first, second = gateways
    async with aiohttp.ClientSession() as http:
        bots = await _json(
            await http.post(
                f"{first}/api/games",
                json={"game": "teeko", "seats": [{"bot": "random"}, {"bot": "greedy"}]},
            ),
            201,
        )
        seat = await _json(
            await http.post(
                f"{first}/api/games",
                json={"game": "teeko", "seats": [{"human": {}}, {"bot": "random"}]},
            ),
            201,
        )
        gid, token = seat["id"], seat["tokens"][0]
        # Spectators on both gateways; the seat plays over HTTP on the first.
        sockets = [await http.ws_connect(f"{base}/ws/games/{gid}") for base in gateways]
        watching = [asyncio.create_task(_events(ws)) for ws in sockets]
        logged = await _play_seat(http, first, gid, token)
        seen = await asyncio.wait_for(asyncio.gather(*watching), 30)
        for ws in sockets:
            await ws.close()
        end = (await _until_ended(http, second, gid))["seq"]
        for got in seen:  # every event once, in order, on each gateway's socket
            assert [s for s, _ in got] == list(range(1, end + 1))
        # The second gateway follows the feeds itself: each move reached its socket at once,
        # not on its 5 s fallback read of the log.
        arrived = dict(seen[1])
        late = {s: round(arrived[s] - t, 2) for s, t in logged.items() if arrived[s] - t > 1.5}
        assert len(logged) >= 4 and not late, late
        assert (await _until_ended(http, second, bots["id"]))["status"] == "ended"
    # A round robin through the directors.
    created = _agon(
        env, "tournament", "create", "--format", "round-robin", "--game", "teeko",
        "--bots", "random,greedy", "--move-time", "1", "--concurrency", "2", "--json",
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    tid = json.loads(created.stdout)["id"]
    redis = aioredis.Redis.from_url(url)
    try:
        store = TournamentStore(redis, Keys())
        deadline = time.monotonic() + 90
        while (t := await store.load(tid)) is None or t.ended is None:
            assert time.monotonic() < deadline, "the tournament did not end"
            await asyncio.sleep(0.2)
        events = await store.events(tid)
    finally:
        await redis.aclose()
    assert t.ended.reason == "completed"
    scheduled = [e.game_id for e in events if e.type == "game_scheduled"]
    assert len(scheduled) == len(set(scheduled)) >= 2  # nothing scheduled twice
    assert all(s.recorded is not None for s in t.games.values())


def _check_status(data: dict[str, Any], replicas: dict[str, int]) -> None:
    roles = Counter(p["role"] for p in data["processes"])
    expected = Counter({svc: n for svc, n in replicas.items() if svc != "bots"})
    expected.update({f"bot-{b}": replicas["bots"] for b in bot_names()})
    assert roles == expected
    assert all(p["alive"] for p in data["processes"]), data["processes"]
    groups = {g["group"]: g for g in data["groups"]}
    assert list(groups) == ["engine", "projector", "dispatcher", "workers"]
    # The engines divide the partitions (services.bus.ownership): each holds a share, the
    # shares cover every partition once, and no stream has more engines than there are.
    shares = [p["stats"]["partitions"] for p in data["processes"] if p["role"] == "engine"]
    assert sum(shares) == Keys().partitions and all(shares), shares
    assert 1 <= groups["engine"]["consumers"] <= replicas["engine"]
    for g in groups.values():
        assert g["pending"] == 0 and g["lag"] == 0, g
    assert len(data["replies"]) == replicas["gateway"]
    assert all(r["alive"] for r in data["replies"])
    assert data["games"]["live"] == 0 and data["games"]["finished"] >= 4
    assert data["redis"]["nodes"][0]["aof"]
