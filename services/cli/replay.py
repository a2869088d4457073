"""`agon replay`: step through a game's log in the terminal, or print one position of it.

The log comes from Redis (`agon replay GAME_ID`, `--redis-url`, default `$REDIS_URL`), from
an archive for a game no longer in Redis (`--archive DIR`, default `$AGON_ARCHIVE`: `agon
archive`), or from a JSONL export (`agon replay --file EXPORT.jsonl`, no Redis). A file is
checked first as `agon verify-export` checks it (an archived one against its index, too).
It is folded with `GameFold`, as the gateway folds it, so the position after ply N is the
one `GET /api/games/{id}?ply=N` shows. Each position is drawn on the engine's geometry
(`Board.render`: square and hexagonal boards alike) beside a key of the cell labels:
pieces as X (colour 1) and O (colour 2), Overflow's stack heights, and on Supply Chains and
Supplier Sabotage pieces the surplus Ludii prints on them (`State.display()`: a deficit
never overwrites the last value shown), with `+` on a warehouse and `!` on a deficit
warehouse. Below: who holds which colour, the scores, the seat to move, Teeko's hands, the
result at the end, and the numbered move list with the current ply's move in brackets.

On a terminal without `--ply` it is interactive (rich's `Live` on the alternate screen,
keys read in cbreak mode): ←/→ (h/l, p/n) step, Home/End jump, q quits. Otherwise it prints
the position after ply N (default: the end) once. Every bad input (unknown game, unreadable
or corrupted file, ply out of range, Redis away) is one line and exit 2; Redis going away
while the log is read (a failover) is said in one line and waited for, up to `--wait-s`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import termios
import tty
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.panel import Panel
from rich.text import Text

from engine import Move
from engine.boards import Board
from schemas.codec import unpack_event
from schemas.events import NO_RESULT_REASONS
from schemas.wording import ending
from services.archive import ARCHIVE_ENV, Archive, ArchiveError
from services.bus.clients import LogEntry, QueryClient
from services.bus.connection import RedisUnavailable, connect, redact, ride_out
from services.bus.keys import Keys
from services.cli.common import add_service_arguments, add_wait_argument, say_arena
from services.cli.export import read_text
from services.cli.options import UsageError, non_negative_int
from services.gamelog.export import ExportError, log_problems, read_jsonl
from services.gamelog.fold import GameFold, by_ply

#: Colour 1 and colour 2 as drawn, and their colour-blind-safe styles (Okabe-Ito sky blue
#: and orange, readable on dark and light terminals alike).
PIECE = {1: "X", 2: "O"}
COLOUR_STYLE = {1: "bold #56B4E9", 2: "bold #E69F00"}
EMPTY_STYLE = "dim"
#: Ludii marks warehouses grey and deficit warehouses light red.
WAREHOUSE, WAREHOUSE_STYLE = "+", " on grey30"
DEFICIT, DEFICIT_STYLE = "!", "bold black on #FF9E9E"
LAST_MOVE_STYLE = " underline"
#: Characters from a private-use plane stand for sites while finding where each is drawn.
_SITE_KEY = 0xF0000
#: Between the position and the key of labels beside it.
GAP = "   "
#: The move list wraps at this width at least.
MOVES_WIDTH = 72
HELP = "←/→ h/l p/n: step · Home/End: first/last · q: quit"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("game_id", nargs="?", metavar="GAME_ID", help="the game to read from Redis")
    parser.add_argument(
        "--file",
        metavar="EXPORT.jsonl",
        help="replay a JSONL export (GET /api/games/{id}/export) instead, without Redis",
    )
    parser.add_argument(
        "--ply",
        type=non_negative_int,
        metavar="N",
        help="print the position after ply N and exit (default: step through it on a "
        "terminal, else print the end)",
    )
    parser.add_argument(
        "--archive",
        metavar="DIR",
        default=os.environ.get(ARCHIVE_ENV, ""),
        help=f"read a game that is not in Redis from this archive (default: ${ARCHIVE_ENV})",
    )
    add_service_arguments(parser, private=False)
    add_wait_argument(parser)


def run(args: argparse.Namespace) -> int:
    if (args.game_id is None) == (args.file is None):
        raise UsageError(
            "give a GAME_ID to read from Redis or --file EXPORT.jsonl"
            + (", not both" if args.file is not None else "")
        )
    entries = _from_file(args.file) if args.file is not None else _from_redis(args)
    replay = Replay.of(entries)
    if args.ply is not None and args.ply > replay.plies:
        raise UsageError(
            f"--ply {args.ply} is past the end: game {replay.game_id} has {replay.plies}"
            f" plies (give 0 to {replay.plies})"
        )
    if args.ply is None and sys.stdin.isatty() and sys.stdout.isatty():
        return _step_through(replay)
    ply = replay.plies if args.ply is None else args.ply
    Console(highlight=False).print(replay.draw(ply), soft_wrap=True)
    return 0


# -- reading the log --------------------------------------------------------------------------
def _from_file(name: str) -> list[LogEntry]:
    """The events of an export, which must be one game's sound log (chain and replay)."""
    try:
        entries = read_jsonl(read_text(name))
    except ExportError as exc:
        raise UsageError(f"cannot read {name}: {exc}") from None
    problems = log_problems(entries)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise UsageError(
            f"{name} is not a sound game log: {problems[0]}{more};"
            f" `agon verify-export {name}` lists every problem"
        )
    return entries


def _from_redis(args: argparse.Namespace) -> list[LogEntry]:
    """The game's log from Redis, or from the archive when Redis has none."""
    url = args.redis_url
    if url:
        say_arena(args)
    if not url and not args.archive:
        raise UsageError(
            "which Redis? pass --redis-url or set REDIS_URL, or start the arena (make run, or"
            " agon up); or replay an export with --file, or an archived game with --archive DIR"
        )
    keys = Keys(args.prefix, args.partitions)
    entries = asyncio.run(_read_log(url, keys, args.game_id, args.wait_s)) if url else []
    if not entries and args.archive:
        entries = _from_archive(args.archive, args.game_id)
    if not entries:
        places = [f"in Redis at {redact(url)} (key prefix {keys.prefix!r},"
                  f" {keys.partitions} partitions)"] if url else []  # fmt: skip
        places += [f"in the archive {args.archive}"] if args.archive else []
        raise UsageError(
            f"no game {args.game_id!r} {' nor '.join(places)}: check the id, or list games"
            " with GET /api/games (?status=archived)"
        )
    return entries


def _from_archive(root: str, game_id: str) -> list[LogEntry]:
    """An archived game's log, checked as `--file` is; [] if the archive has no such game."""
    if not os.path.isdir(root):
        raise UsageError(f"--archive {root}: no such directory")
    try:
        entries = Archive(root).load(game_id, replay=True, tree=True)
    except ArchiveError as exc:
        raise UsageError(f"{exc}; the archived file is not a sound game log") from None
    return entries or []


async def _read_log(url: str, keys: Keys, game_id: str, wait_s: float) -> list[LogEntry]:
    # One attempt to connect: a wrong URL is said at once. Once Redis answered, a failover
    # while the log is read is waited out (`--wait-s`).
    try:
        redis = await connect(url, wait_s=0)
    except RedisUnavailable as exc:
        raise UsageError(str(exc)) from None
    try:
        return await ride_out(
            lambda: QueryClient(redis, keys).log(game_id),
            wait_s=wait_s,
            say=lambda line: print(f"agon replay: {line}", file=sys.stderr, flush=True),
        )
    except RedisUnavailable as exc:
        raise UsageError(f"lost Redis at {redact(url)} while reading: {exc}") from None
    finally:
        await redis.aclose()


# -- the positions ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Position:
    """The game after one ply as drawn: a token and a style per site, and the facts below."""

    tokens: tuple[str, ...]
    styles: tuple[str, ...]
    facts: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Replay:
    """A game's log folded into its position after every ply, ready to draw."""

    game_id: str
    title: str
    board: Board
    legend: str
    #: the colour that played each move, and the move
    moves: tuple[tuple[int, str], ...]
    #: positions[n] is the game after n plies
    positions: tuple[Position, ...]
    #: one width for every token of every position, so the board keeps its shape throughout
    token_width: int
    #: per drawn line, where each site's token starts (`_layout`)
    layout: tuple[tuple[tuple[int, int], ...], ...]

    @property
    def plies(self) -> int:
        return len(self.moves)

    @classmethod
    def of(cls, entries: Sequence[LogEntry]) -> Replay:
        """Fold a log, keeping the position before each move and the one at the end.

        A log the fold cannot read (a corrupted entry in Redis) is a UsageError.
        """
        try:
            positions: list[Position] = []
            colours: list[int] = []  # of the seat to move before each move
            for _, fold in by_ply(unpack_event(e.data) for e in entries):
                if fold.game is None:
                    raise ValueError(fold.error)
                positions.append(_position(fold))
                colours.append(fold.colour_of(fold.to_move) if fold.to_move else 0)
            game_id = fold.game_id
            moves = list(zip(colours, fold.moves, strict=False))
        except (ValueError, KeyError, TypeError, StopIteration) as exc:
            raise UsageError(f"cannot replay this log: {exc}") from None
        game, state = fold.game, fold.state
        assert game is not None and state is not None  # checked in the loop
        width = max(len(token) for p in positions for token in p.tokens)
        options = " ".join(f"{k}={v}" for k, v in game.options.items())
        return cls(
            game_id=game_id,
            title=f"{game.name} · {options}" if options else game.name,
            board=game.board,
            legend=_legend(game.name, shows_surplus=state.display() is not None),
            moves=tuple(moves),
            positions=tuple(positions),
            token_width=width,
            layout=_layout(game.board, width),
        )

    def draw(self, ply: int, *, width: int | None = None, height: int | None = None) -> Text:
        """The position after `ply` with everything around it, as styled text.

        Without `width` (printing once) the key of labels stands beside the board and the
        move list is whole. With a screen's size, the key goes beside the board if it fits,
        else below it if there is room, else it is left out (and so are blank lines, if
        still short of room); the move list shows the lines around the current move that fit.
        """
        position = self.positions[ply]
        board = self._board(position, self._last_move(ply))
        # Labels as wide as the tokens draw the key in the board's own shape.
        labels = [label.rjust(self.token_width) for label in self.board.labels]
        key = Text(self.board.render(labels))
        key.stylize("dim")
        head = [
            Text(self.title, style="bold"),
            Text(f"game {self.game_id} · ply {ply} of {self.plies}"),
            Text(),
        ]
        legend = [Text(self.legend)] if self.legend else []
        below = [Text(), *legend, *(Text(f) for f in position.facts), Text()]
        pictures = [_beside(board, key), Text("\n").join([board, Text(), key]), board]
        if width is None:
            picture = pictures[0]
        else:
            fits = [
                p
                for p in pictures
                if _width(p) <= width
                and (height is None or len(head) + _height(p) + len(below) < height)
            ]
            picture = fits[0] if fits else board
            if height is not None and len(head) + _height(picture) + len(below) >= height:
                head, below = head[:-1], [line for line in below if line]  # no blank lines
        wrap = max(MOVES_WIDTH, _width(picture))
        wrap = wrap if width is None else min(wrap, width)
        lines = self._move_lines(ply, wrap)
        if height is not None:
            lines = _around(lines, ply, max(1, height - len(head) - _height(picture) - len(below)))
        return Text("\n").join([*head, picture, *below, *(line for line, _ in lines)])

    def _board(self, position: Position, marked: set[int]) -> Text:
        """The board with each site's token where `Board.render` puts it, styled."""
        width = self.token_width
        rows = []
        for row in self.layout:
            line = Text()
            for start, site in row:
                line.append(" " * (start - len(line)))
                style = position.styles[site] + (LAST_MOVE_STYLE if site in marked else "")
                line.append(position.tokens[site].rjust(width), style=style)
            rows.append(line)
        return Text("\n").join(rows)

    def _last_move(self, ply: int) -> set[int]:
        """The sites of the move that led to ply `ply` (none at the start)."""
        if ply == 0:
            return set()
        move = Move.parse(self.moves[ply - 1][1])
        return {self.board.site(label) for label in (move.cell, move.to) if label}

    def _move_lines(self, ply: int, width: int) -> list[tuple[Text, range]]:
        """The numbered moves wrapped at `width`, the one that led to `ply` in brackets;
        each line with the plies whose moves it holds."""
        lines: list[tuple[Text, range]] = []
        line, first = Text("moves:"), 1
        for n, (colour, move) in enumerate(self.moves, start=1):
            entry = f"{n}. {PIECE[colour]} {move}"
            entry, style = (f"[{entry}]", "reverse") if n == ply else (entry, "")
            if len(line) + 2 + len(entry) > width and n > first:
                lines.append((line, range(first, n)))
                line, first = Text(" " * len("moves:")), n
            line.append("  ")
            line.append(entry, style=style or ("dim" if n > ply else ""))
        lines.append((line, range(first, self.plies + 1)))
        return lines


def _position(fold: GameFold) -> Position:
    """What is drawn of the game as `fold` has it now."""
    game, state = fold.game, fold.state
    assert game is not None and state is not None
    text = state.board_string()
    facts = [_seats(fold)]
    if game.name == "overflow":
        tokens, styles = _stacks(game.board, text)
    else:
        tokens = [PIECE[int(ch)] if ch != "." else "." for ch in text]
        styles = [COLOUR_STYLE[int(ch)] if ch != "." else EMPTY_STYLE for ch in text]
        display = state.display()
        if display is not None:
            _surpluses(game.board, display.to_dict(), text, tokens, styles)
    if fold.scores is not None:
        facts.append(f"scores: X {fold.scores[0]} · O {fold.scores[1]}")
    if game.name == "teeko":
        markers = int(game.options["markers"])
        hands = " · ".join(f"{PIECE[c]} {markers - text.count(str(c))}" for c in (1, 2))
        facts.append(f"in hand: {hands}")
    facts.append(_status(fold))
    return Position(tuple(tokens), tuple(styles), tuple(facts))


def _stacks(board: Board, heights: str) -> tuple[list[str], list[str]]:
    """Overflow: each stack's height, coloured by the house its square belongs to."""
    tokens, styles = [], []
    for cell, height in zip(board.cells, heights.split(","), strict=True):
        tokens.append(height if height != "0" else ".")
        styles.append(COLOUR_STYLE[1 if cell.phase == 1 else 2] if height != "0" else EMPTY_STYLE)
    return tokens, styles


def _surpluses(
    board: Board, shown: dict[str, Any], text: str, tokens: list[str], styles: list[str]
) -> None:
    """Supply Chains, Supplier Sabotage: the number on each piece and the warehouse marks."""
    values: dict[str, int] = shown["surplus_values"]
    warehouses = {label for chain in shown["chains"] for label in chain["warehouses"]}
    deficits = {label for labels in shown["deficit_warehouses"].values() for label in labels}
    for site, cell in enumerate(board.cells):
        if text[site] == ".":
            continue
        tokens[site] += str(values.get(cell.label, ""))
        if cell.label in deficits:
            tokens[site] += DEFICIT
            styles[site] = DEFICIT_STYLE
        elif cell.label in warehouses:
            tokens[site] += WAREHOUSE
            styles[site] += WAREHOUSE_STYLE


def _legend(game: str, *, shows_surplus: bool) -> str:
    if game == "overflow":
        return "stack heights; X's house: the squares with row+column odd (B1, A2, ...)"
    if shows_surplus:
        return (
            f"numbers: chain surplus as Ludii shows it · {WAREHOUSE} warehouse"
            f" · {DEFICIT} deficit warehouse"
        )
    return ""  # the seats line says who plays X and who O


def _seats(fold: GameFold) -> str:
    seats = sorted(fold.seats, key=lambda s: s["colour"])
    return " · ".join(
        f"{PIECE[s['colour']]}: seat {s['seat']} {s['name'] or '?'} ({s['kind']})" for s in seats
    )


def _status(fold: GameFold) -> str:
    if fold.status == "waiting":
        return "waiting for its seats"
    result = fold.result
    if result is None:
        return f"to move: seat {fold.to_move} ({PIECE[fold.colour_of(fold.to_move)]})"
    reason = ending(result["reason"], result["detail"])
    if result["reason"] in NO_RESULT_REASONS:
        return f"result: aborted ({reason})"
    if not result["winner"]:
        return f"result: draw ({reason})"
    seat = fold.seats[result["winner"] - 1]
    return f"result: seat {seat['seat']} {seat['name']} wins ({reason})"


# -- drawing ----------------------------------------------------------------------------------
def _layout(board: Board, width: int) -> tuple[tuple[tuple[int, int], ...], ...]:
    """Per drawn line, where each site's token of `width` characters starts, left to right.

    `Board.render` decides where cells go; it is asked once, with a private-use character
    standing for each site, so tokens can be styled one by one.
    """
    keys = [chr(_SITE_KEY + site).rjust(width) for site in range(board.num_sites)]
    return tuple(
        tuple(
            (col + 1 - width, ord(ch) - _SITE_KEY)
            for col, ch in enumerate(line)
            if ord(ch) >= _SITE_KEY
        )
        for line in board.render(keys).split("\n")
    )


def _width(text: Text) -> int:
    return max(len(line) for line in text.plain.split("\n"))


def _height(text: Text) -> int:
    return text.plain.count("\n") + 1


def _beside(board: Text, key: Text) -> Text:
    board_width = _width(board)
    lines = []
    for left, right in zip(board.split("\n"), key.split("\n"), strict=True):
        left.append(" " * (board_width - len(left)) + GAP)
        left.append_text(right)
        lines.append(left)
    return Text("\n").join(lines)


def _around(lines: list[tuple[Text, range]], ply: int, room: int) -> list[tuple[Text, range]]:
    """At most `room` of the move lines, the one holding move `ply` among them."""
    at = next((i for i, (_, plies) in enumerate(lines) if ply in plies), 0)
    start = max(0, min(at - room // 2, len(lines) - room))
    return lines[start : start + room]


# -- stepping through -------------------------------------------------------------------------
#: What each key does: a step back or forward, the first or last ply, quit.
KEYS: dict[bytes, str] = {
    **dict.fromkeys([b"\x1b[D", b"\x1bOD", b"h", b"p"], "back"),
    **dict.fromkeys([b"\x1b[C", b"\x1bOC", b"l", b"n"], "forward"),
    **dict.fromkeys([b"\x1b[H", b"\x1bOH", b"\x1b[1~", b"\x1b[7~"], "first"),
    **dict.fromkeys([b"\x1b[F", b"\x1bOF", b"\x1b[4~", b"\x1b[8~"], "last"),
    **dict.fromkeys([b"q", b"Q"], "quit"),
}


def read_keys(pending: bytes) -> tuple[list[str], bytes]:
    """The actions of the keys in `pending`, and what is left: the start of a key sequence
    that may still be arriving. Bytes of other keys are dropped."""
    actions = []
    while pending:
        key = next((k for k in KEYS if pending.startswith(k)), None)
        if key is not None:
            actions.append(KEYS[key])
            pending = pending[len(key) :]
        elif any(k.startswith(pending) for k in KEYS):
            break
        else:
            pending = pending[1:]
    return actions, pending


def step(ply: int, action: str, last: int) -> int:
    """The ply an action leads to from `ply`, within 0..last."""
    moves = {"back": ply - 1, "forward": ply + 1, "first": 0, "last": last}
    return min(max(moves.get(action, ply), 0), last)


def _step_through(replay: Replay) -> int:
    """Show the game on the alternate screen and follow the keys until q (or end of input)."""
    console = Console(highlight=False)
    ply = replay.plies

    def screen() -> Panel:
        # Inside the panel: 2 columns of border and 2 of padding, 2 lines of border.
        width, height = console.size
        text = replay.draw(ply, width=width - 4, height=height - 2)
        text.no_wrap, text.overflow = True, "crop"
        return Panel(text, title="agon replay", subtitle=HELP, subtitle_align="left", expand=False)

    fd = sys.stdin.fileno()
    live = Live(get_renderable=screen, console=console, screen=True, auto_refresh=False)
    with _keys_one_by_one(fd), live, _redraw_on_resize(live):
        live.refresh()  # Live draws nothing at start when it is given no renderable
        pending = b""
        while data := os.read(fd, 64):
            actions, pending = read_keys(pending + data)
            if "quit" in actions:
                break
            for action in actions:
                ply = step(ply, action, replay.plies)
            live.refresh()
    return 0


@contextlib.contextmanager
def _keys_one_by_one(fd: int) -> Iterator[None]:
    """The terminal in cbreak mode (each key at once, unechoed; Ctrl-C still interrupts),
    put back as it was however the block ends."""
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


@contextlib.contextmanager
def _redraw_on_resize(live: Live) -> Iterator[None]:
    previous = signal.signal(signal.SIGWINCH, lambda _signum, _frame: live.refresh())
    try:
        yield
    finally:
        signal.signal(signal.SIGWINCH, previous)
