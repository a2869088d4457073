"""`agon replay`: a game's log drawn as text, from Redis or an export, printed or stepped through.

Every game here is real: played by random bots through the running services (`arena`), then
read back by the command, in a subprocess, from the test's Redis database or from an export
of the log. Each drawn board is checked against the engine's own position and surplus
display at that ply, replayed here move by move with `engine.load_game` (not with the fold
the command uses). The interactive mode is driven through a pseudo-terminal.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine import load_game
from schemas.codec import unpack
from services.bus.clients import LogEntry, QueryClient
from services.bus.embedded import free_port
from services.cli.pipeline import create_games, wait_until_ended
from services.cli.replay import HELP, Replay, read_keys, step
from services.gamelog.export import export_jsonl
from tests.support.gateway import Arena

ROOT = Path(__file__).resolve().parents[2]
#: A drawn piece: its colour, the number shown on it, and a warehouse mark.
TOKEN = re.compile(r"^([XO])(\d*)([+!]?)$")
#: What terminals send around the text: CSI sequences (styles, cursor, alternate screen).
CSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


# -- games played through the pipeline --------------------------------------------------------
async def played(arena: Arena, game: str, options: dict[str, str], count: int = 1) -> list[str]:
    """`count` games between random bots, played to the end; their ids (fixed: the random
    bot draws from the game id, so the same games are played every run)."""
    run_id = "-".join(["r", *options.values()])
    ids = await create_games(
        arena.redis, arena.keys, [(game, options)], count, ["random", "random"], run_id=run_id
    )
    assert await wait_until_ended(arena.redis, arena.keys, ids, 120.0) == []
    return ids


async def log(arena: Arena, game_id: str) -> list[LogEntry]:
    return await QueryClient(arena.redis, arena.keys).log(game_id)


def moves(entries: Sequence[LogEntry]) -> list[str]:
    return [ev["move"] for ev in map(unpack, (e.data for e in entries)) if "move" in ev]


def created(entries: Sequence[LogEntry]) -> dict[str, Any]:
    return unpack(entries[0].data)


async def agon(*args: str, redis_url: str | None = None) -> subprocess.CompletedProcess[str]:
    """`agon replay ARGS` in a subprocess (waited for in a thread: the services go on)."""
    # Plain text, whatever the environment asks of rich; Redis only where named.
    unset = ("REDIS_URL", "FORCE_COLOR", "TTY_COMPATIBLE")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    if redis_url is not None:
        env["REDIS_URL"] = redis_url
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "services.cli", "replay", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        encoding="utf-8",
        timeout=60,
    )


# -- reading what is drawn --------------------------------------------------------------------
def drawn(text: str) -> dict[str, str]:
    """Label -> token of the board in a drawing: its lines run from the fourth to the next
    blank one, each the position's tokens and then the key's labels, in the same order."""
    lines = text.split("\n")
    cells: dict[str, str] = {}
    for line in lines[3 : lines.index("", 3)]:
        words = line.split()
        half = len(words) // 2
        cells.update(zip(words[half:], words[:half], strict=True))
    return cells


def engine_at(game: str, options: dict[str, str], played: Sequence[str], ply: int) -> Any:
    state = load_game(game, **options).new_initial_state()
    for move in played[:ply]:
        state.apply(move)
    return state


def check_board(text: str, entries: Sequence[LogEntry], ply: int) -> Any:
    """The drawing of `ply` shows the engine's position there; the engine state."""
    first = created(entries)
    game = load_game(first["game"], **first["options"])
    state = engine_at(first["game"], first["options"], moves(entries), ply)
    cells = drawn(text)
    assert sorted(cells) == sorted(game.board.labels)
    position = state.board_string()
    if game.name == "overflow":
        heights = position.split(",")
        assert [cells[c.label] for c in game.board.cells] == [
            h if h != "0" else "." for h in heights
        ]
        return state
    display = state.display()
    shown = display.to_dict() if display is not None else None
    for cell, piece in zip(game.board.cells, position, strict=True):
        token = cells[cell.label]
        if piece == ".":
            assert token == ".", cell.label
            continue
        match = TOKEN.match(token)
        assert match is not None, (cell.label, token)
        colour, number, mark = match.groups()
        assert colour == "XO"[int(piece) - 1], cell.label
        if shown is None:
            assert number == mark == "", (cell.label, token)
            continue
        assert number == str(shown["surplus_values"][cell.label]), (ply, cell.label, token)
        deficit = any(cell.label in d for d in shown["deficit_warehouses"].values())
        warehouse = any(cell.label in c["warehouses"] for c in shown["chains"])
        assert mark == ("!" if deficit else "+" if warehouse else ""), (ply, cell.label, token)
    return state


def first_deficit(entries: Sequence[LogEntry]) -> int | None:
    """The first ply at which the engine shows a deficit warehouse, if any."""
    first = created(entries)
    state = load_game(first["game"], **first["options"]).new_initial_state()
    for ply, move in enumerate([*moves(entries), None]):
        display = state.display()
        assert display is not None
        if any(display.to_dict()["deficit_warehouses"].values()):
            return ply
        if move is not None:
            state.apply(move)
    return None


def header(text: str) -> str:
    return text.split("\n")[1]


# -- printing one position --------------------------------------------------------------------
async def test_every_ply_of_supply_chains_shows_the_engines_surplus_display(
    arena: Arena, redis_url: str
) -> None:
    games = await played(arena, "supply-chains", {}, count=8)
    logs = {gid: await log(arena, gid) for gid in games}
    # A game whose display shows a deficit, where Ludii keeps the last number shown.
    deficits = {gid: first_deficit(entries) for gid, entries in logs.items()}
    gid = next((g for g, ply in deficits.items() if ply is not None), None)
    assert gid is not None, f"no deficit warehouse in any of {games}: pick other games"
    entries, deficit = logs[gid], deficits[gid]
    assert deficit is not None
    total = len(moves(entries))

    replay = Replay.of(entries)
    assert replay.plies == total
    for ply in range(total + 1):
        check_board(replay.draw(ply).plain, entries, ply)

    plies = sorted({0, 1, deficit, deficit + 1, total // 2, total})
    for ply in plies:
        out = await agon(gid, "--prefix", arena.keys.prefix, "--ply", str(ply), redis_url=redis_url)
        assert (out.returncode, out.stderr) == (0, ""), out.stderr
        assert header(out.stdout) == f"game {gid} · ply {ply} of {total}"
        state = check_board(out.stdout, entries, ply)
        if ply:
            assert re.search(rf"\[{ply}\. [XO] {re.escape(moves(entries)[ply - 1])}\]", out.stdout)
        else:
            assert "[" not in out.stdout.split("moves:")[1]
        if ply == deficit:
            assert "!" in "".join(drawn(out.stdout).values())
        if ply < total:
            assert "to move: seat " in out.stdout and "result:" not in out.stdout
        else:
            assert re.search(
                r"^result: (seat \d .* wins|draw) \((no placement left|both passed)\)",
                out.stdout,
                re.M,
            )
        scores = state.scores()
        assert f"scores: X {scores[0]} · O {scores[1]}" in out.stdout
    # Without --ply (and no terminal): the end.
    end = await agon(gid, "--prefix", arena.keys.prefix, redis_url=redis_url)
    assert end.returncode == 0 and header(end.stdout) == f"game {gid} · ply {total} of {total}"


async def test_an_export_replays_without_redis(
    arena: Arena, redis_url: str, tmp_path: Path
) -> None:
    [sabotage] = await played(arena, "supplier-sabotage", {"board": "hex-3-4"})
    [teeko] = await played(arena, "teeko", {})
    for gid in (sabotage, teeko):
        entries = await log(arena, gid)
        export = tmp_path / f"{gid}.jsonl"
        export.write_text(export_jsonl(entries))
        total = len(moves(entries))
        for ply in (0, total // 2, total):
            out = await agon("--file", str(export), "--ply", str(ply))
            assert (out.returncode, out.stderr) == (0, "")
            check_board(out.stdout, entries, ply)
            # The same drawing as from the log in Redis.
            live = await agon(
                gid, "--prefix", arena.keys.prefix, "--ply", str(ply), redis_url=redis_url
            )
            assert live.stdout == out.stdout
    out = await agon("--file", str(tmp_path / f"{teeko}.jsonl"), "--ply", "4")
    assert "in hand: X 6 · O 6" in out.stdout  # Teeko: 8 markers each, 2 placed
    assert out.stdout.startswith("teeko · markers=8\n")


async def test_every_game_and_board_shape_is_drawn(arena: Arena) -> None:
    for game, options in [
        ("overflow", {"size": "5"}),
        ("hexade", {}),
        ("supply-chains", {"board": "square-8"}),
        ("supplier-sabotage", {"board": "hex-triangle-5"}),
    ]:
        [gid] = await played(arena, game, options)
        entries = await log(arena, gid)
        replay = Replay.of(entries)
        for ply in range(0, replay.plies + 1, max(1, replay.plies // 12)):
            check_board(replay.draw(ply).plain, entries, ply)
        check_board(replay.draw(replay.plies).plain, entries, replay.plies)
        # On a screen of 22 lines the drawing fits, with the current move among the moves.
        for ply in (1, replay.plies // 2, replay.plies):
            screen = replay.draw(ply, width=76, height=22).plain
            assert len(screen.split("\n")) <= 22, screen
            assert f"ply {ply} of {replay.plies}" in screen
            assert f"[{ply}. " in screen


# -- bad inputs ---------------------------------------------------------------------------------
def refused(out: subprocess.CompletedProcess[str], message: str) -> None:
    assert out.returncode == 2 and out.stdout == "", out
    assert len(out.stderr.splitlines()) == 1 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.startswith(f"agon replay: {message}"), out.stderr


async def test_bad_inputs_are_one_line_and_exit_2(
    arena: Arena, redis_url: str, tmp_path: Path
) -> None:
    [gid] = await played(arena, "teeko", {})
    entries = await log(arena, gid)
    total = len(moves(entries))
    good = tmp_path / "good.jsonl"
    good.write_text(export_jsonl(entries))
    prefix = ("--prefix", arena.keys.prefix)

    refused(await agon("nope", *prefix, redis_url=redis_url), "no game 'nope' in Redis at redis://")
    refused(await agon(gid, "--prefix", "other", redis_url=redis_url), f"no game {gid!r}")
    port = free_port()
    refused(
        await agon(gid, "--redis-url", f"redis://127.0.0.1:{port}"),
        f"cannot reach Redis at redis://127.0.0.1:{port}",
    )
    refused(await agon(gid), "which Redis? pass --redis-url or set REDIS_URL")
    refused(await agon(), "give a GAME_ID to read from Redis or --file EXPORT.jsonl")
    refused(await agon(gid, "--file", str(good)), "give a GAME_ID to read from Redis or --file")
    refused(
        await agon("--file", str(good), "--ply", str(total + 1)),
        f"--ply {total + 1} is past the end: game {gid} has {total} plies (give 0 to {total})",
    )
    refused(
        await agon(gid, *prefix, "--ply", str(total + 1), redis_url=redis_url),
        f"--ply {total + 1} is past the end",
    )
    bad = await agon("--file", str(good), "--ply", "-1")
    assert bad.returncode == 2 and bad.stdout == "" and "Traceback" not in bad.stderr
    assert bad.stderr.startswith("agon replay: error: argument --ply: must be a whole number ≥ 0")

    missing, binary = tmp_path / "missing.jsonl", tmp_path / "binary.jsonl"
    binary.write_bytes(b"\xff\xfe\x00")
    refused(await agon("--file", str(missing)), f"cannot read {missing}: No such file or directory")
    refused(await agon("--file", str(tmp_path)), f"cannot read {tmp_path}: Is a directory")
    refused(await agon("--file", str(binary)), f"cannot read {binary}: not UTF-8 text")

    lines = export_jsonl(entries).splitlines()
    broken = tmp_path / "broken.jsonl"
    broken.write_text("\n".join([*lines[:3], "{not json", *lines[4:]]) + "\n")
    refused(await agon("--file", str(broken)), f"cannot read {broken}: line 4: not JSON")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    refused(await agon("--file", str(empty)), f"cannot read {empty}: no events")
    # Lines in the wrong order, and a move changed: the chain and the replay give them away.
    swapped = tmp_path / "swapped.jsonl"
    swapped.write_text("\n".join([*lines[:4], lines[5], lines[4], *lines[6:]]) + "\n")
    refused(await agon("--file", str(swapped)), f"{swapped} is not a sound game log: game {gid}")
    i = next(n for n, line in enumerate(lines) if '"type":"move_played"' in line)
    event = json.loads(lines[i])
    event["move"] = "xA1"
    forged = tmp_path / "forged.jsonl"
    forged.write_text("\n".join([*lines[:i], json.dumps(event), *lines[i + 1 :]]) + "\n")
    refused(await agon("--file", str(forged)), f"{forged} is not a sound game log: game {gid}")


# -- stepping through on a terminal -------------------------------------------------------------
def test_keys() -> None:
    assert read_keys(b"\x1b[Dlq") == (["back", "forward", "quit"], b"")
    assert read_keys(b"h\x1b[") == (["back"], b"\x1b[")  # the rest of an arrow is on its way
    assert read_keys(b"\x1b[" + b"C") == (["forward"], b"")
    assert read_keys(b"\x1b[A\x1b[1;5Dzx\x1bOH\x1b[4~") == (["first", "last"], b"")
    assert [step(5, a, 9) for a in ("back", "forward", "first", "last")] == [4, 6, 0, 9]
    assert (step(0, "back", 9), step(9, "forward", 9)) == (0, 9)


class Terminal:
    """`agon replay` on a pseudo-terminal of 50 lines by 120 columns; what it shows, as text."""

    def __init__(self, *args: str) -> None:
        self.master, self.slave = pty.openpty()
        fcntl.ioctl(self.slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 120, 0, 0))
        self.settings = termios.tcgetattr(self.slave)
        env = {"PATH": os.environ["PATH"], "TERM": "xterm-256color", "LANG": "C.UTF-8"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "services.cli", "replay", *args],
            cwd=ROOT,
            env=env,
            stdin=self.slave,
            stdout=self.slave,
            stderr=self.slave,
            start_new_session=True,
        )
        self.raw = b""
        self.mark = 0

    def send(self, keys: bytes) -> None:
        self.mark = len(self.raw)
        os.write(self.master, keys)

    def expect(self, text: str, end: str = "", timeout_s: float = 30.0) -> str:
        """Read until the screen shows `text` after the last keys sent, and `end` after it
        (the screen is drawn in full); what it showed."""
        deadline = time.monotonic() + timeout_s
        while True:
            shown = CSI.sub("", self.raw[self.mark :].decode("utf-8", "replace"))
            shown = shown.replace("\r", "")
            if text in shown and end in shown[shown.index(text) :]:
                return shown
            left = deadline - time.monotonic()
            assert left > 0, f"{text!r} never shown; got {shown[-2000:]!r}"
            ready, _, _ = select.select([self.master], [], [], min(left, 0.2))
            if ready:
                try:
                    self.raw += os.read(self.master, 65536)
                except OSError:  # the other side is closed
                    time.sleep(0.05)

    def rest(self) -> bytes:
        """What is left to read once the program is gone."""
        while select.select([self.master], [], [], 0.5)[0]:
            self.raw += os.read(self.master, 65536)
        return self.raw[self.mark :]

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        os.close(self.master)
        os.close(self.slave)


async def test_stepping_through_on_a_terminal(arena: Arena, tmp_path: Path) -> None:
    [gid] = await played(arena, "supply-chains", {})
    entries = await log(arena, gid)
    total = len(moves(entries))
    export = tmp_path / "game.jsonl"
    export.write_text(export_jsonl(entries))
    terminal = Terminal("--file", str(export))
    try:
        await asyncio.to_thread(terminal.expect, f"ply {total} of {total}")  # opens at the end
        screen = ""
        for keys, ply in [
            (b"\x1b[D", total - 1),
            (b"\x1b[H", 0),
            (b"\x1b[C", 1),
            (b"l", 2),
            (b"n", 3),
            (b"\x1b[", None),  # half an arrow key...
            (b"C", 4),  # ... and the rest
            (b"p", 3),
            (b"h", 2),
            (b"\x1b[F", total),
            (b"\x1bOH", 0),
        ]:
            terminal.send(keys)
            if ply is not None:
                screen = await asyncio.to_thread(terminal.expect, f"ply {ply} of {total}", HELP)
        # The board on the screen is the one `--ply` prints.
        printed = (await agon("--file", str(export), "--ply", "0")).stdout.split("\n")
        board = printed[3 : printed.index("", 3)]
        assert all(line in screen for line in board), screen
        terminal.send(b"q")
        assert await asyncio.to_thread(terminal.process.wait, 30) == 0
        assert b"\x1b[?1049l" in terminal.rest()  # the alternate screen is left
        assert termios.tcgetattr(terminal.slave) == terminal.settings  # and the terminal reset
    finally:
        terminal.close()


async def test_ply_on_a_terminal_prints_once(arena: Arena, tmp_path: Path) -> None:
    [gid] = await played(arena, "teeko", {})
    export = tmp_path / "game.jsonl"
    export.write_text(export_jsonl(await log(arena, gid)))
    terminal = Terminal("--file", str(export), "--ply", "2")
    try:
        terminal.send(b"\x1b[D\x1b[D")  # not read: nothing to step through
        await asyncio.to_thread(terminal.expect, "moves:")
        assert await asyncio.to_thread(terminal.process.wait, 30) == 0
        shown = terminal.rest()
        assert "ply 2 of " in CSI.sub("", shown.decode())
        assert b"\x1b[?1049h" not in shown  # no alternate screen
    finally:
        terminal.close()
