"""`agon conformance`: replay Ludii's recorded trials and Pattern/Line verdicts through the engine.

A trial file (JSONL, one playout a line; format in shared/conformance/README.md) is
checked ply by ply: the mover, the legal-move set (as a set, after translating
Ludii's move texts into Agon notation, RULES.md §9), then the recorded move is
applied and the board and scores compared; at the end the result. A pattern file
holds Ludii's verdicts for `is Pattern` / `is Line` on random positions.

The runner never re-draws random moves and knows nothing of particular trials:
point it at any file Ludii recorded. A file it cannot read, or a line that is not a
record of the documented format, is a `UsageError` naming the file and line (exit 2);
a disagreement with Ludii is a failed check (exit 1).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine import Game, State, load_game
from engine.boards import Board, load_board
from engine.pattern import check_pattern_lines, parse_walk
from services.cli.options import UsageError

_ADD = re.compile(r"^Add@(\d+)$")
_REMOVE = re.compile(r"^Remove@(\d+)$")
_MOVE = re.compile(r"^Move (H?\d+)->(\d+)$")
_SELECT = re.compile(r"^Select (\d+)->(\d+)$")


def translate(board: Board, ludii: str) -> str:
    """Ludii's move text as Agon notation (conformance/README.md, RULES.md §9).

    `ValueError` for a text of no known form, or naming a site not on the board.
    """

    def label(site: str | int) -> str:
        if not 0 <= int(site) < board.num_sites:
            raise ValueError(f"Ludii move text {ludii!r}: site {site} is not on {board.name}")
        return board.labels[int(site)]

    if ludii in ("Pass", "Swap"):
        return ludii.lower()
    if m := _ADD.match(ludii):
        return label(m[1])
    if m := _REMOVE.match(ludii):
        return "x" + label(m[1])
    if m := _MOVE.match(ludii):
        to = label(m[2])
        return to if m[1].startswith("H") else f"{label(m[1])}-{to}"
    if sel := _SELECT.match(ludii):
        frm, dest = int(sel[1]), int(sel[2])
        if frm == dest:  # Supplier Sabotage's removal: a Select with only `from`
            return "x" + label(frm)
        label(frm)
        for direction in board.directions("adjacent"):
            if board.step("adjacent", direction)[frm] == dest:
                return f"{label(frm)}>{direction}"
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
    try:
        theirs = [translate(board, t) for t in ply["legal"]]
        move = translate(board, ply["move"])
    except ValueError as e:  # a move text naming no site or direction of our board
        return f"{where}: {e}"
    if set(ours) != set(theirs) or len(ours) != len(set(ours)):
        return f"{where}: legal moves differ: {_set_diff(ours, theirs)}"
    if move not in theirs:
        return f"{where}: Ludii plays {move}, which is not among its legal moves"
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


#: What a record must hold, by field (RULES.md and shared/conformance/README.md).
_TRIAL_FIELDS: dict[str, type | tuple[type, ...]] = {
    "agon": dict,
    "over": bool,
    "winner": int,
    "plies": list,
}
_PLY_FIELDS: dict[str, type | tuple[type, ...]] = {
    "ply": int,
    "mover": int,
    "legal": list,
    "move": str,
    "board_after": str,
}
_OPTIONAL_SCORES = (list, type(None))
_PATTERN_FIELDS: dict[str, type | tuple[type, ...]] = {
    "board": str,
    "seed": int,
    "position_index": int,
    "position": str,
    "true_sites": list,
}
_FORMAT = "see the record format in shared/conformance/README.md"


def _field_problem(
    record: Mapping[str, Any], fields: Mapping[str, type | tuple[type, ...]], what: str
) -> str | None:
    for name, kind in fields.items():
        if name not in record:
            return f"{what} has no {name!r}"
        if not isinstance(record[name], kind):
            return f"{what}: {name!r} is {type(record[name]).__name__} {_short(record[name])}"
    return None


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _trial_problem(record: Mapping[str, Any]) -> str | None:
    """What makes `record` no Ludii trial record, or None."""
    problem = _field_problem(record, _TRIAL_FIELDS, "trial record")
    if problem is not None:
        return problem
    spec = record["agon"]
    if not isinstance(spec.get("game"), str) or not isinstance(spec.get("options"), dict):
        return "trial record: 'agon' wants an object with 'game' and 'options'"
    if not isinstance(record.get("final_scores"), _OPTIONAL_SCORES):
        return "trial record: 'final_scores' is neither a list nor null"
    for i, ply in enumerate(record["plies"]):
        problem = _ply_problem(ply, f"ply {i} of the trial record")
        if problem is not None:
            return problem
    return None


def _ply_problem(ply: Any, what: str) -> str | None:
    if not isinstance(ply, dict):
        return f"{what} is not a JSON object"
    problem = _field_problem(ply, _PLY_FIELDS, what)
    if problem is not None:
        return problem
    if not all(isinstance(t, str) for t in ply["legal"]):
        return f"{what}: 'legal' is not a list of move texts"
    if not isinstance(ply.get("scores_after"), _OPTIONAL_SCORES):
        return f"{what}: 'scores_after' is neither a list nor null"
    return None


def _pattern_problem(record: Mapping[str, Any]) -> str | None:
    """What makes `record` no Pattern/Line verdict record, or None."""
    problem = _field_problem(record, _PATTERN_FIELDS, "verdict record")
    if problem is not None:
        return problem
    try:
        board = load_board(record["board"])
        if "walk" in record:
            if not isinstance(record["walk"], str):
                return "verdict record: 'walk' is not a text like \"F R F\""
            parse_walk(record["walk"])
        elif not isinstance(record.get("line"), int) or record["line"] < 1:
            return "verdict record wants a 'walk' text or a 'line' length of at least 1"
    except ValueError as e:  # an unknown board or a walk of unknown steps
        return f"verdict record: {e}"
    position = record["position"]
    if len(position) != board.num_sites or set(position) - set(".12"):
        return (
            f"verdict record: position {_short(position)} wants one of '.', '1', '2'"
            f" for each of the {board.num_sites} sites of {board.name}"
        )
    if not all(isinstance(s, int) and 0 <= s < board.num_sites for s in record["true_sites"]):
        return f"verdict record: 'true_sites' are not all sites of {board.name}"
    return None


def _read(path: Path) -> tuple[list[str], list[tuple[int, dict[str, Any]]]]:
    """The file's lines, and its records with their line numbers; a UsageError if it has none.

    A file that cannot be read, or a line that is not a JSON object, is a UsageError.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path} is not UTF-8 text; it should be JSONL ({_FORMAT})") from None
    lines = text.split("\n")
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise _malformed(path, number, f"not JSON ({e.msg}, column {e.colno})") from None
        if not isinstance(record, dict):
            raise _malformed(path, number, f"a JSON {type(record).__name__}, not an object")
        records.append((number, record))
    if not records:
        raise UsageError(f"{path} holds no records: nothing to check ({_FORMAT})")
    return lines, records


def _malformed(path: Path, number: int, problem: str) -> UsageError:
    return UsageError(f"{path} line {number}: {problem}; {_FORMAT}")


def check_trial_file(path: Path) -> FileResult:
    """Replay every playout of a trial file (UsageError if it is not one)."""
    _, records = _read(path)
    return _check_trials(path, records)


def _check_trials(path: Path, records: list[tuple[int, dict[str, Any]]]) -> FileResult:
    for number, trial in records:  # the whole file first: no checking half a broken file
        problem = _trial_problem(trial)
        if problem is not None:
            raise _malformed(path, number, problem)
    result = FileResult(str(path))
    games: dict[str, Game] = {}
    for number, trial in records:
        spec = trial["agon"]
        key = json.dumps(spec, sort_keys=True)
        if key not in games:
            try:
                games[key] = load_game(spec["game"], **spec["options"])
            except ValueError as e:  # an unknown game or option: the engine's message says which
                raise UsageError(f"{path} line {number}: {e}") from None
        check_trial(games[key], trial, result)
    return result


def check_file(path: Path) -> FileResult:
    """A trial or a verdict file, told apart by the first record (UsageError if neither)."""
    lines, records = _read(path)
    first = records[0][1]
    if "walk" not in first and "line" not in first:
        return _check_trials(path, records)
    for number, record in records:
        problem = _pattern_problem(record)
        if problem is not None:
            raise _malformed(path, number, problem)
    passed, failed, mismatch = check_pattern_lines(lines)
    return FileResult(str(path), passed, failed, mismatch)


def check_readable(paths: Iterable[Path]) -> None:
    """Raise a UsageError for the first path that is not a readable file."""
    for path in paths:
        if path.is_dir():
            raise UsageError(f"cannot read {path}: it is a directory; give the .jsonl files in it")
        try:
            with path.open("rb"):
                pass
        except OSError as e:
            raise UsageError(f"cannot read {path}: {e.strerror or e}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", type=Path, help="trial or pattern JSONL files")


def run(args: argparse.Namespace) -> int:
    check_readable(args.files)
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
    from services.cli import main

    sys.exit(main(["conformance", *sys.argv[1:]]))
