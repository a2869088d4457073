"""`agon status` as an operator runs it (a real process) against running services: on the
session's redis-server and on the session's Redis Cluster.

It must list every process with its heartbeat, show a backlog where there is one (lag and
pending entries, the worst inbox named), count live and finished games, show Redis memory;
a process killed with -9 shows as stale and fails `--check`; `--json` parses, `--watch`
redraws until interrupted; a Redis that is not there is one line and a non-zero exit.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from services.bus.connection import connect
from services.bus.embedded import free_port
from services.bus.keys import WORKERS_GROUP, Keys
from services.bus.reader import ensure_group
from services.cli.common import WHICH_REDIS
from services.cli.pipeline import ServiceSet, create_games, selfplay
from tests.services.test_operability import READY_S, Agon, is_ready
from tests.support.cluster import ClusterTarget
from tests.support.gateway import until

ROOT = Path(__file__).resolve().parents[2]
#: No REDIS_URL or AGON_SECRET from outside; a wide terminal for the tables.
ENV = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "AGON_SECRET")}
ENV["COLUMNS"] = "240"

pytestmark = pytest.mark.timeout(180)


def agon_status(url: str, prefix: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services.cli", "status", "--redis-url", url, "--prefix", prefix,
         *args],
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


async def status_of(url: str, prefix: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`agon status` in a thread, so that services running in this loop go on beating."""
    return await asyncio.to_thread(agon_status, url, prefix, *args)


async def status_json(url: str, prefix: str) -> dict[str, Any]:
    done = await status_of(url, prefix, "--json")
    assert done.returncode == 0, done.stderr
    data: dict[str, Any] = json.loads(done.stdout)
    return data


def by_group(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {g["group"]: g for g in data["groups"]}


async def test_status_shows_processes_backlogs_games_and_memory(
    redis: aioredis.Redis, redis_url: str, namespace: str
) -> None:
    keys = Keys(prefix=namespace)
    services = ServiceSet(redis, keys, ["random"], block_ms=50)
    await services.start()
    try:
        played = await selfplay(
            redis, keys, [("teeko", {})], 3, ["random", "random"], services=False, timeout_s=60
        )
        assert played.finished == 3
        # A backlog: two games wait for greedy, whom nobody serves; a worker that then died
        # took one turn (pending, never acknowledged), the other was never delivered (lag).
        inbox = keys.bot_turns("greedy")
        await ensure_group(redis, inbox, WORKERS_GROUP)
        await create_games(redis, keys, [("teeko", {})], 2, ["greedy", "random"])
        assert await until(lambda: _length(redis, inbox, 2), 20)
        await redis.xreadgroup(WORKERS_GROUP, "greedy-gone", {inbox: ">"}, count=1)
        data = await status_json(redis_url, namespace)
        table = await status_of(redis_url, namespace)
    finally:
        await services.stop()

    roles = {p["role"]: p for p in data["processes"]}
    assert set(roles) == {"engine", "projector", "dispatcher", "bot-random", "director"}
    assert all(p["alive"] and p["age_ms"] <= 1000 for p in data["processes"]), data["processes"]
    assert roles["engine"]["stats"]["accepted"] >= 3 and roles["engine"]["group"] == "engine"
    groups = by_group(data)
    assert list(groups) == ["engine", "projector", "dispatcher", "workers"]
    for name in ("engine", "projector", "dispatcher"):
        assert groups[name]["streams"] == keys.partitions and groups[name]["consumers"] == 1
    workers = groups["workers"]
    assert (workers["lag"], workers["pending"]) == (1, 1), workers
    assert workers["worst"]["where"] == "bot greedy" and workers["worst"]["pending"] == 1
    assert data["games"] == {"waiting": 0, "live": 2, "finished": 3, "total": 5}
    (node,) = data["redis"]["nodes"]
    assert not data["redis"]["cluster"] and node["role"] == "master"
    assert node["used_memory"] > 0 and node["maxmemory_policy"]
    # The table says the same.
    assert table.returncode == 0, table.stderr
    for text in ("5 alive, 0 stale", "bot greedy: lag 1, pending 1", "2 live", "3 finished"):
        assert text in table.stdout, table.stdout
    assert all(p["name"] in table.stdout for p in data["processes"])


async def _length(redis: aioredis.Redis, stream: str, n: int) -> bool:
    return int(await redis.xlen(stream)) >= n


def test_a_killed_process_shows_as_stale_and_fails_the_health_check(
    redis_url: str, namespace: str
) -> None:
    worker = Agon("bots", "--bot", "random", "--redis-url", redis_url, "--prefix", namespace)
    try:
        assert worker.wait_for(is_ready, READY_S) is not None, worker.text()
        ok = agon_status(redis_url, namespace, "--check", "--here")
        assert ok.returncode == 0 and ok.stdout.startswith("ok: 1 live process"), ok
        worker.proc.send_signal(signal.SIGKILL)
        worker.wait(10)
        time.sleep(1.3)  # a beat older than a second is stale
        done = agon_status(redis_url, namespace, "--json")
        assert done.returncode == 0, done.stderr
        (process,) = json.loads(done.stdout)["processes"]
        assert process["role"] == "bot-random" and not process["alive"]
        assert process["age_ms"] > 1000 and process["pid"] == worker.proc.pid
        table = agon_status(redis_url, namespace)
        assert "0 alive, 1 stale" in table.stdout and "stale" in table.stdout
        check = agon_status(redis_url, namespace, "--check", "--here")
        assert check.returncode == 1 and check.stdout == ""
        assert check.stderr.strip().endswith("(1 stale)")
        assert len(check.stderr.splitlines()) == 1
    finally:
        worker.close()


def test_watch_redraws_until_interrupted(redis_url: str, namespace: str) -> None:
    watch = subprocess.Popen(
        [sys.executable, "-m", "services.cli", "status", "--redis-url", redis_url,
         "--prefix", namespace, "--json", "--watch", "0.2"],
        cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert watch.stdout is not None
        first = json.loads(watch.stdout.readline())
        second = json.loads(watch.stdout.readline())
        watch.send_signal(signal.SIGINT)
        _, err = watch.communicate(timeout=20)
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()
    assert first["processes"] == [] and first["games"]["total"] == 0
    assert second["time"] > first["time"]
    assert watch.returncode == 0 and "Traceback" not in err, err


@pytest.mark.parametrize("flags", [(), ("--json",), ("--check", "--here")])
def test_an_unreachable_redis_is_one_line(flags: tuple[str, ...]) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    done = agon_status(dead, "agon", *flags)
    assert done.returncode == 1 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"agon status: cannot reach Redis at {dead}"), line


def test_status_without_a_redis_says_which() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "services.cli", "status"],
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"agon status: {WHICH_REDIS}"]


async def test_status_on_a_cluster(cluster_url: ClusterTarget) -> None:
    redis = await connect(cluster_url.url)
    keys = Keys(prefix=cluster_url.prefix)
    services = ServiceSet(redis, keys, ["random"], block_ms=50, director=False)
    await services.start()
    try:
        played = await selfplay(
            redis, keys, [("teeko", {})], 2, ["random", "random"], services=False, timeout_s=60
        )
        assert played.finished == 2
        data = await status_json(cluster_url.url, cluster_url.prefix)
        table = await status_of(cluster_url.url, cluster_url.prefix)
    finally:
        await services.stop()
        await redis.aclose()
    r = data["redis"]
    assert r["cluster"] and r["state"] == "ok" and r["slots_ok"] == 16384
    assert len(r["nodes"]) == 3 and {n["role"] for n in r["nodes"]} == {"master"}
    assert len({n["node"] for n in r["nodes"]}) == 3 and all(n["used_memory"] for n in r["nodes"])
    assert {p["role"] for p in data["processes"]} == {
        "engine", "projector", "dispatcher", "bot-random",
    }  # fmt: skip
    groups = by_group(data)
    assert groups["engine"]["streams"] == keys.partitions
    assert (groups["engine"]["lag"], groups["engine"]["pending"]) == (0, 0)
    assert data["games"]["finished"] == 2
    assert table.returncode == 0 and "Redis Cluster, state ok" in table.stdout, table
