"""Ctrl-C stops every command that plays or serves within 5 s: no traceback, nothing left.

Each command runs as the real `agon` console script in a process group of its own, as a
terminal runs it, and gets SIGINT sent to the whole group (what Ctrl-C does): `agon up
--demo` during the demo and after it, `agon match`, `agon tournament run` and one service.
Then it must have exited within `STOP_S`, with no "Traceback" in its output, and every
process it had started (its private redis-server, a tournament's bot workers) must be gone
too. A second Ctrl-C while it stops ends it at once, and `agon selfplay` does not wait for
a bot still thinking in a thread.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from services.bus.embedded import free_port

AGON = shutil.which("agon", path=str(Path(sys.executable).parent)) or shutil.which("agon")

#: What the issue asks: everything stopped within this long after Ctrl-C.
STOP_S = 5.0
#: How long a command may take to start (a private Redis, the services, bot processes).
START_S = 60.0


class Terminal:
    """`agon ARGS` run as a terminal runs it: its own process group, output collected."""

    def __init__(self, *args: str, env: dict[str, str]) -> None:
        assert AGON is not None, "the agon console script is not installed (make venv)"
        self.proc = subprocess.Popen(
            [AGON, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()

    def text(self) -> str:
        with self._changed:
            return "".join(self.lines)

    def wait_for(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self._changed:
            while text not in "".join(self.lines):
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise AssertionError(f"no {text!r} in {timeout:g} s:\n{''.join(self.lines)}")
                self._changed.wait(min(left, 0.2))

    def descendants(self) -> set[int]:
        """Every process below this one now (its children, theirs, ...)."""
        found: set[int] = set()
        todo = [self.proc.pid]
        while todo:
            pid = todo.pop()
            for task in Path(f"/proc/{pid}/task").glob("*"):
                try:
                    children = (task / "children").read_text().split()
                except OSError:
                    continue
                for child in map(int, children):
                    if child not in found:
                        found.add(child)
                        todo.append(child)
        return found

    def ctrl_c(self) -> None:
        os.killpg(self.proc.pid, signal.SIGINT)

    def stops_within(self, seconds: float) -> float:
        """Wait for the exit; how long it took (SIGKILL to the group if it did not)."""
        asked = time.monotonic()
        try:
            self.proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            self.kill()
            text = self.text()
            raise AssertionError(f"still running {seconds:g} s after Ctrl-C:\n{text}") from None
        self._reader.join(timeout=5)
        return time.monotonic() - asked

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        self._reader.join(timeout=5)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


def _gone(pid: int) -> bool:
    """True once `pid` is neither running nor a zombie nobody reaped."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state == "X"


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[Callable[..., Terminal]]:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env["AGON_ARENA_FILE"] = str(tmp_path / "arena.json")
    started: list[Terminal] = []

    def start(*args: str) -> Terminal:
        started.append(Terminal(*args, env=env))
        return started[-1]

    yield start
    for term in started:
        term.close()


def assert_stops_cleanly(term: Terminal, *, twice: bool = False) -> float:
    """Ctrl-C (twice if asked); it and all it started end within STOP_S, no traceback."""
    children = term.descendants()
    assert children, f"nothing started below the command:\n{term.text()}"
    term.ctrl_c()
    if twice:
        time.sleep(0.2)
        term.ctrl_c()
    took = term.stops_within(STOP_S)
    assert "Traceback" not in term.text(), term.text()
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline and not all(map(_gone, children)):
        time.sleep(0.05)
    left = [pid for pid in children if not _gone(pid)]
    assert not left, f"processes left after Ctrl-C: {left}\n{term.text()}"
    return took


def _up(terminal: Callable[..., Terminal]) -> Terminal:
    up = terminal("up", "--demo", "--bots", "greedy,random", "--port", str(free_port()))
    up.wait_for("agon up: ready", START_S)
    return up


def test_ctrl_c_during_the_demo_stops_up_and_its_redis(
    terminal: Callable[..., Terminal],
) -> None:
    up = _up(terminal)
    up.wait_for("a demo tournament plays", START_S)
    assert "games ended" not in up.text()
    assert_stops_cleanly(up)


def test_ctrl_c_after_the_demo_stops_up(terminal: Callable[..., Terminal], tmp_path: Path) -> None:
    up = _up(terminal)
    up.wait_for("games ended", START_S)
    assert (tmp_path / "arena.json").exists(), "agon up did not record its arena"
    assert_stops_cleanly(up)
    assert not (tmp_path / "arena.json").exists(), "agon up left its arena recorded"


def test_a_second_ctrl_c_stops_at_once(
    terminal: Callable[..., Terminal],
) -> None:
    up = _up(terminal)
    assert_stops_cleanly(up, twice=True)


def test_ctrl_c_stops_a_match_and_its_bot_processes(terminal: Callable[..., Terminal]) -> None:
    match = terminal(
        "match", "greedy", "random", "--game", "teeko", "--sprt", "0,50", "--move-time", "0.2"
    )
    match.wait_for("pair 1:", START_S)
    assert_stops_cleanly(match)
    assert "resume with" not in match.text(), "a private Redis is gone: nothing to resume"


def test_ctrl_c_stops_a_tournament_run(terminal: Callable[..., Terminal]) -> None:
    run = terminal(
        "tournament", "run", "--format", "round-robin", "--game", "teeko",
        "--bots", "greedy,random", "--rounds", "20", "--move-time", "0.2",
    )  # fmt: skip
    run.wait_for(" ended; points: ", START_S)
    time.sleep(1.0)
    assert_stops_cleanly(run)


def test_ctrl_c_stops_a_service(terminal: Callable[..., Terminal]) -> None:
    engine = terminal("engine")
    engine.wait_for(" ready: ", START_S)
    assert_stops_cleanly(engine)


def test_ctrl_c_stops_selfplay_while_a_bot_thinks(terminal: Callable[..., Terminal]) -> None:
    # mcts thinks in a thread that cannot be cancelled: the command does not wait for it.
    play = terminal("selfplay", "--game", "teeko", "--games", "20", "--bots", "mcts,random")
    play.wait_for("bot-mcts", START_S)
    time.sleep(2.0)
    assert_stops_cleanly(play)
    assert play.proc.returncode == 130
