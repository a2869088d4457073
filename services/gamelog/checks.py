"""A game's log checked on its own: as a hash chain (`chain_problems`) and replayed through the
rules (`replay_problems`). Pure: no Redis, no clock.

A problem is one precise line (game, seq, what the log says, what the rules say); an empty
list means the log holds. `agon verify` runs both over every stored log, export runs them
over a file before it is trusted (`services.gamelog.export.log_problems`), and the engine
over a log it is asked to import.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine import State, load_game
from schemas.codec import DecodeError, decode_event, event_hash
from schemas.events import GameCreated, GameEnded, GameStarted, MovePlayed, PlayerSeated
from services.bus.clients import LogEntry


def chain_problems(game_id: str, entries: Sequence[LogEntry]) -> list[str]:
    """Everything wrong with a log as a hash chain: decoding, ids, seqs, links.

    An empty list means: every entry decodes, entry n has seq n and the entry id
    "<n>-0", belongs to `game_id`, and its prev_hash is the sha256 of entry n-1's bytes.
    """
    problems: list[str] = []
    prev = ""
    for n, entry in enumerate(entries, start=1):
        where = f"game {game_id} entry {n}"
        if entry.seq != n:
            problems.append(f"{where}: entry id has seq {entry.seq}, expected {n}")
        try:
            event = decode_event(entry.data)
        except DecodeError as exc:
            problems.append(f"{where}: undecodable event ({exc.message})")
            prev = event_hash(entry.data)
            continue
        if event.seq != n:
            problems.append(f"{where}: event seq {event.seq}, expected {n}")
        if event.game_id != game_id:
            problems.append(f"{where}: event belongs to game {event.game_id}")
        if event.prev_hash != prev:
            problems.append(
                f"{where}: prev_hash {event.prev_hash or '(empty)'} does not match"
                f" sha256 of entry {n - 1} ({prev or '(empty)'})"
            )
        prev = event_hash(entry.data)
    return problems


def replay_problems(game_id: str, entries: Sequence[LogEntry]) -> list[str]:
    """Replay a log through the engine's checked path; every fact it disagrees with.

    Checks seats and turn order, every move's legality, the recorded scores, colours
    and seat to move, and that the game ends when and as the rules say.
    """
    problems: list[str] = []
    state: State | None = None
    seated: set[int] = set()
    started = ended = False
    for entry in entries:
        where = f"game {game_id} seq {entry.seq}"
        try:
            ev = decode_event(entry.data)
        except DecodeError:
            return problems  # `chain_problems` reports it; nothing after it can be checked
        if ended:
            problems.append(f"{where}: {ev.type} after the game ended")
            continue
        if isinstance(ev, GameCreated):
            if state is not None:
                problems.append(f"{where}: a second game_created")
                continue
            try:
                state = load_game(ev.game, **ev.options).new_initial_state()
            except ValueError as exc:
                problems.append(f"{where}: {exc}")
                return problems
            continue
        if state is None:
            problems.append(f"{where}: {ev.type} before game_created")
            return problems
        if isinstance(ev, PlayerSeated):
            if ev.seat in seated:
                problems.append(f"{where}: seat {ev.seat} seated twice")
            seated.add(ev.seat)
        elif isinstance(ev, GameStarted):
            if seated != {1, 2}:
                problems.append(f"{where}: started with seats {sorted(seated)} taken")
            started = True
            _expect(problems, where, "to_move", ev.to_move, state.seat_to_move)
            _expect(problems, where, "colours", ev.colours, state.seat_colours())
        elif isinstance(ev, MovePlayed):
            if not started:
                problems.append(f"{where}: a move before game_started")
            _expect(problems, where, "seat", ev.seat, state.seat_to_move)
            _expect(problems, where, "colour", ev.colour, state.current_player)
            _expect(problems, where, "ply", ev.ply, state.ply)
            try:
                state.apply(ev.move)
            except ValueError as exc:
                problems.append(f"{where}: move {ev.move!r} rejected by the rules: {exc}")
                return problems
            scores = state.scores()
            _expect(problems, where, "scores_after", ev.scores_after, _list(scores))
            _expect(problems, where, "colours", ev.colours, state.seat_colours())
            _expect(problems, where, "to_move", ev.to_move, state.seat_to_move)
        elif isinstance(ev, GameEnded):
            ended = True
            outcome = state.outcome()
            if ev.reason == "natural":
                if outcome is None:
                    problems.append(f"{where}: natural end but the rules say the game goes on")
                else:
                    winner = state.seat_of(outcome.winner) if outcome.winner else 0
                    _expect(problems, where, "result", ev.result, winner)
                    _expect(problems, where, "scores", ev.scores, _list(outcome.scores))
                    _expect(problems, where, "detail", ev.detail, outcome.reason)
            elif outcome is not None:
                problems.append(f"{where}: {ev.reason} after the rules had ended the game")
    if state is not None and state.is_terminal and not ended:
        problems.append(f"game {game_id}: the rules ended the game but the log has no game_ended")
    return problems


def _list(scores: tuple[int, int] | None) -> list[int] | None:
    return None if scores is None else list(scores)


def _expect(problems: list[str], where: str, name: str, logged: Any, rules: Any) -> None:
    if logged != rules:
        problems.append(f"{where}: {name} is {logged!r} in the log, the rules say {rules!r}")
