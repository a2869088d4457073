"""The command line finds the arena `agon up` (`make run`) runs, and says what is missing.

`agon up` records its Redis in the arena file (`services.cli.arena`) and removes it when it
stops; with no `--redis-url` and no `$REDIS_URL`, `agon status`, `agon tournament run` and
`agon replay` use that Redis, so the tournament plays in the arena and shows on its page.
A command that only drives a deployment says within 5 s, in one line, what to start when
no engine serves its Redis. `resume with --id` is offered only where the Redis outlives
the command.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from argparse import Namespace
from pathlib import Path

import pytest

from services.bus.embedded import free_port
from services.cli import arena
from services.cli.tournament import _kept, _resume
from tests.services.test_operability import ENV, READY_S, ROOT, Agon


def _env(tmp_path: Path) -> dict[str, str]:
    return {**ENV, arena.ARENA_ENV: str(tmp_path / "arena.json")}


def _record(tmp_path: Path, redis_url: str, pid: int | None = None) -> dict[str, str]:
    """An environment whose arena file names `redis_url`, run by `pid` (this process)."""
    data = {"redis_url": redis_url, "url": "http://127.0.0.1:1", "pid": pid or os.getpid()}
    (tmp_path / "arena.json").write_text(json.dumps(data))
    return _env(tmp_path)


def _agon(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services.cli", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


# -- the record -------------------------------------------------------------------------------
def test_the_arena_is_recorded_found_and_forgotten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(arena.ARENA_ENV, str(tmp_path / "arena.json"))
    assert arena.recorded_url() is None
    assert arena.record("redis://127.0.0.1:7/0", "http://127.0.0.1:8") == tmp_path / "arena.json"
    assert arena.recorded_url() == "redis://127.0.0.1:7/0"
    arena.forget()
    assert not (tmp_path / "arena.json").exists()


def test_a_stale_record_is_ignored_and_a_live_one_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(arena.ARENA_ENV, str(tmp_path / "arena.json"))
    gone = subprocess.Popen(["true"])
    gone.wait()
    _record(tmp_path, "redis://127.0.0.1:7/0", pid=gone.pid)
    assert arena.recorded_url() is None, "the arena of a process that is gone"
    alive = subprocess.Popen(["sleep", "30"])
    try:
        _record(tmp_path, "redis://127.0.0.1:7/0", pid=alive.pid)
        assert arena.record("redis://127.0.0.1:9/0", "http://x") is None, "a second agon up"
        assert arena.recorded_url() == "redis://127.0.0.1:7/0"
        arena.forget()  # not this process's: left alone
        assert arena.recorded_url() == "redis://127.0.0.1:7/0"
    finally:
        alive.kill()
        alive.wait()


# -- the commands use it ------------------------------------------------------------------------
def test_status_uses_the_arena_with_no_flags(
    tmp_path: Path, redis_url: str, namespace: str
) -> None:
    done = _agon("status", "--prefix", namespace, "--json", env=_record(tmp_path, redis_url))
    assert done.returncode == 0, done.stderr
    assert "using the arena `agon up` runs" in done.stderr
    json.loads(done.stdout)


def test_without_an_arena_an_inspecting_command_says_what_to_start(tmp_path: Path) -> None:
    done = _agon("status", env=_env(tmp_path))
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert "--redis-url" in line and "make run" in line and "agon up" in line, line


@pytest.mark.parametrize(
    "command", [("status",), ("tournament", "run"), ("replay",), ("match",), ("selfplay",)]
)
def test_help_says_the_arena_is_used(command: tuple[str, ...], tmp_path: Path) -> None:
    done = _agon(*command, "--help", env=_env(tmp_path))
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "else the Redis of the arena `agon up` (make run) runs" in text, text


def test_up_does_not_join_another_arena(tmp_path: Path) -> None:
    done = _agon("up", "--help", env=_env(tmp_path))
    assert "arena" not in done.stdout


@pytest.mark.parametrize("command", ["tournament", "match"])
def test_a_redis_with_no_engine_is_said_within_5_s(
    command: str, tmp_path: Path, redis_url: str, namespace: str
) -> None:
    args = (
        ["tournament", "run", "--format", "round-robin", "--bots", "greedy,random"]
        if command == "tournament"
        else ["match", "greedy", "random", "--sprt", "0,50"]
    )
    started = time.monotonic()
    done = _agon(
        *args, "--game", "teeko", "--prefix", namespace, env=_record(tmp_path, redis_url),
        timeout=30,
    )  # fmt: skip
    took = time.monotonic() - started
    assert took < 5.0, f"{took:.1f} s:\n{done.stderr}"
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    lines = [x for x in done.stderr.splitlines() if "using the arena" not in x]
    assert len(lines) == 1, done.stderr
    assert "no engine" in lines[0] and "agon up" in lines[0], lines[0]
    assert "private redis-server" not in done.stderr + done.stdout
    assert "resume with" not in done.stdout, "nothing was created: nothing to resume"


def test_resume_is_offered_where_the_redis_outlives_the_command() -> None:
    match = Namespace(
        tournament_command="match", a="mcts", b="random", game="teeko", sprt="0,10",
        redis_url="redis://x/0",
    )  # fmt: skip
    assert _resume(match, "t1") == "agon match mcts random --game teeko --sprt 0,10 --id t1"
    run = Namespace(tournament_command="run", redis_url=None)
    assert _resume(run, "t1") == "agon tournament run --id t1"
    assert _kept(match) and not _kept(run)


# -- agon up records it; a tournament from another terminal plays in it ------------------------
def test_a_tournament_run_with_no_flags_plays_in_the_arena(
    tmp_path: Path, redis_url: str, namespace: str
) -> None:
    env = _env(tmp_path)
    port = free_port()
    up = Agon(
        "up", "--redis-url", redis_url, "--prefix", namespace, "--bots", "greedy,random",
        "--port", str(port), env=env,
    )  # fmt: skip
    try:
        _play_in_the_arena(up, tmp_path, env, namespace, port, redis_url)
    finally:
        up.close()


def _play_in_the_arena(
    up: Agon, tmp_path: Path, env: dict[str, str], namespace: str, port: int, redis_url: str
) -> None:
    line = up.wait_for(lambda x: "agon up: ready" in x, READY_S, stream="stdout")
    assert line is not None, up.text()
    assert f"recorded in {tmp_path / 'arena.json'}" in line, line
    assert json.loads((tmp_path / "arena.json").read_text())["redis_url"] == redis_url

    run = _agon(
        "tournament", "run", "--prefix", namespace, "--format", "round-robin", "--game",
        "teeko", "--bots", "greedy,random", "--move-time", "0.1", "--json", env=env,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "private redis-server" not in run.stderr
    report = json.loads(run.stdout.splitlines()[-1])
    tid = report["id"]
    assert f"resume with agon tournament run --id {tid}" in run.stderr
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/tournaments") as page:
        listed = [t["id"] for t in json.loads(page.read())["tournaments"]]
    assert tid in listed, "the tournament does not show on the arena's page"

    replay = _agon("replay", report["schedule"][0]["game_id"], "--prefix", namespace, env=env)
    assert replay.returncode == 0, replay.stderr
    assert "using the arena" in replay.stderr

    assert up.terminate() == 0, up.text()
    assert not (tmp_path / "arena.json").exists(), "agon up left its arena recorded"
