"""`agon conformance`: replay Ludii's recorded trials and Pattern/Line verdicts through the engine.

A trial file (JSONL, one playout a line; format in shared/conformance/README.md) is
checked ply by ply: the mover, the legal-move set (as a set, after translating
Ludii's move texts into Agon notation, RULES.md §9), then the recorded move is
applied and the board and scores compared; at the end the result. A pattern file
holds Ludii's verdicts for `is Pattern` / `is Line` on random positions.

The runner never re-draws random moves and knows nothing of particular trials:
point it at any file Ludii recorded.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine import Game, State, load_game
from engine.boards import Board
from engine.pattern import check_pattern_lines

_ADD = re.compile(r"^Add@(\d+)$")
_REMOVE = re.compile(r"^Remove@(\d+)$")
_MOVE = re.compile(r"^Move (H?\d+)->(\d+)$")
_SELECT = re.compile(r"^Select (\d+)->(\d+)$")


def translate(board: Board, ludii: str) -> str:
    """Ludii's move text as Agon notation (conformance/README.md, RULES.md §9)."""
    label = board.labels
    if ludii in ("Pass", "Swap"):
        return ludii.lower()
    if m := _ADD.match(ludii):
        return label[int(m[1])]
    if m := _REMOVE.match(ludii):
        return "x" + label[int(m[1])]
    if m := _MOVE.match(ludii):
        to = label[int(m[2])]
        return to if m[1].startswith("H") else f"{label[int(m[1])]}-{to}"
    if sel := _SELECT.match(ludii):
        frm, dest = int(sel[1]), int(sel[2])
        if frm == dest:  # Supplier Sabotage's removal: a Select with only `from`
            return "x" + label[frm]
        for direction in board.directions("adjacent"):
            if board.step("adjacent", direction)[frm] == dest:
                return f"{label[frm]}>{direction}"
    raise ValueError(f"unknown Ludii move text {ludii!r}")


@dataclass
class FileResult:
    """One file's count of checks passed and failed, and its first mismatch ("" if none)."""

    path: str
    passed: int = 0
    failed: int = 0
    first_mismatch: str = ""

    def fail(self, message: str) -> None:
        self.failed += 1
        if not self.first_mismatch:
            self.first_mismatch = message


def _set_diff(ours: Iterable[str], theirs: Iterable[str]) -> str:
    a, b = set(ours), set(theirs)
    return f"engine only {sorted(a - b)}, Ludii only {sorted(b - a)}"


def _check_ply(state: State, board: Board, ply: dict[str, Any], where: str) -> str | None:
    """Compare one recorded ply with the engine and apply its move; return a mismatch or None."""
    if state.is_terminal:
        return f"{where}: engine says the game is over, Ludii plays {ply['move']!r}"
    if state.current_player != ply["mover"]:
        return f"{where}: mover is {state.current_player}, Ludii says {ply['mover']}"
    ours = [str(m) for m in state.legal_moves()]
    theirs = [translate(board, t) for t in ply["legal"]]
    if set(ours) != set(theirs) or len(ours) != len(set(ours)):
        return f"{where}: legal moves differ: {_set_diff(ours, theirs)}"
    move = translate(board, ply["move"])
    state.apply(move)
    if state.board_string() != ply["board_after"]:
        return (
            f"{where}: after {move}: board {state.board_string()!r}, Ludii {ply['board_after']!r}"
        )
    expected = ply.get("scores_after")
    if expected is not None and list(state.scores() or ()) != list(expected):
        return f"{where}: after {move}: scores {state.scores()}, Ludii {expected}"
    return None


def _check_end(state: State, trial: dict[str, Any], where: str) -> str | None:
    if bool(trial["over"]) != state.is_terminal:
        return f"{where}: engine terminal={state.is_terminal}, Ludii over={trial['over']}"
    outcome = state.outcome()
    if outcome is None:
        return None
    if outcome.winner != trial["winner"]:
        return f"{where}: winner {outcome.winner} ({outcome.reason}), Ludii {trial['winner']}"
    final = trial.get("final_scores")
    if final is not None and list(outcome.scores or ()) != list(final):
        return f"{where}: final scores {outcome.scores}, Ludii {final}"
    return None


def check_trial(game: Game, trial: dict[str, Any], result: FileResult) -> None:
    """Replay one playout, counting each ply (and the final result) as passed or failed."""
    state = game.new_initial_state()
    label = f"playout {trial.get('playout')} (seed {trial.get('seed')})"
    for ply in trial["plies"]:
        where = f"{label} ply {ply['ply']} position {state.board_string()!r}"
        problem = _check_ply(state, game.board, ply, where)
        if problem is not None:
            result.fail(problem)
            return  # the rest of this playout would only repeat the same divergence
        result.passed += 1
    problem = _check_end(state, trial, f"{label} end")
    if problem is not None:
        result.fail(problem)


def _lines(path: Path) -> Iterator[dict[str, Any]]:
    with path.open() as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def check_trial_file(path: Path) -> FileResult:
    result = FileResult(str(path))
    games: dict[str, Game] = {}
    for trial in _lines(path):
        spec = trial["agon"]
        key = json.dumps(spec, sort_keys=True)
        if key not in games:
            games[key] = load_game(spec["game"], **spec["options"])
        check_trial(games[key], trial, result)
    return result


def check_file(path: Path) -> FileResult:
    """A trial or a verdict file, told apart by the first record."""
    first = next(_lines(path), None)
    if first is not None and ("walk" in first or "line" in first):
        with path.open() as f:
            passed, failed, mismatch = check_pattern_lines(f)
        return FileResult(str(path), passed, failed, mismatch)
    return check_trial_file(path)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", type=Path, help="trial or pattern JSONL files")


def run(args: argparse.Namespace) -> int:
    total_passed = total_failed = 0
    for path in args.files:
        result = check_file(path)
        total_passed += result.passed
        total_failed += result.failed
        status = "ok  " if result.failed == 0 else "FAIL"
        print(f"{status} {path.name}: {result.passed} passed, {result.failed} failed", flush=True)
        if result.first_mismatch:
            print(f"     first mismatch: {result.first_mismatch}", flush=True)
    print(f"{total_passed} passed, {total_failed} failed")
    return 1 if total_failed else 0


if __name__ == "__main__":
    sys.exit(run(argparse.Namespace(files=[Path(p) for p in sys.argv[1:]])))
