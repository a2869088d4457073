"""What `agon tournament run` and `agon match` print, to a terminal and to a pipe.

Piped, `tournament run` prints a progress line as games end (not nothing until the
tables) and nothing is hard-wrapped at 80 columns; in a terminal, log records go through
the console that draws the progress bar. Readiness lines show without -v but as INFO, not
WARNING. A match's pair line labels its counts (pairs, games), a two-player table has no
tie-breaks, the end line says which bot is stronger, and every SPRT option has help text.
"""

from __future__ import annotations

import io
import logging
import subprocess
import sys
import time
from types import SimpleNamespace
from typing import Any

from rich.console import Console
from rich.logging import RichHandler

from services.cli.common import PIPED_WIDTH, _Announcements, logging_to, make_console
from services.cli.tournament import _ending, _print_pairs, _standings
from tests.services.test_operability import ENV, ROOT


def _text(renderable: Any) -> str:
    console = Console(file=io.StringIO(), width=200)
    console.print(renderable)
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert isinstance(out, str)
    return out


def _row(name: str, rank: int, points: float) -> dict[str, Any]:
    return {
        "rank": rank, "name": name, "points": points, "games": 2, "wins": int(points),
        "losses": 2 - int(points), "draws": 0, "buchholz": 7, "sonneborn_berger": 3,
    }  # fmt: skip


def test_a_two_player_table_has_no_tie_breaks() -> None:
    two = {"spec": {"bots": ["a", "b"]}, "standings": [_row("a", 1, 2), _row("b", 2, 0)]}
    assert "Buchholz" not in _text(_standings(two))
    three = {"spec": {"bots": ["a", "b", "c"]}, "standings": [_row("a", 1, 2)]}
    assert "Buchholz" in _text(_standings(three))


def _match_report(wins: int, losses: int, draws: int, pairs: int) -> dict[str, Any]:
    return {
        "sprt": {
            "trajectory": [0.3 * (n + 1) for n in range(pairs)], "lower": -2.94, "upper": 2.94,
            "penta": [0, 0, 0, 0, pairs], "elo1": 10,
        },
        "pairs": [{"wins": wins, "losses": losses, "draws": draws, "elo": 120.0,
                   "elo_error": 30.0, "los": 0.99}],
    }  # fmt: skip


def test_a_pair_line_labels_pairs_and_games() -> None:
    console = Console(file=io.StringIO(), width=300)
    # One pair complete, a third game already ended: 1 pair, 3 games.
    assert _print_pairs(console, _match_report(1, 2, 0, 1), 0) == 1
    line = console.file.getvalue().strip()  # type: ignore[attr-defined]
    assert "1 pair penta [0, 0, 0, 0, 1]" in line, line
    assert "3 games W-L-D 1-2-0" in line, line


def _tournament(reason: str, detail: str, fmt: str = "match") -> Any:
    spec = SimpleNamespace(format=fmt, bots=["mcts", "random"])
    return SimpleNamespace(spec=spec, ended=SimpleNamespace(reason=reason, detail=detail))


def test_the_end_line_says_which_bot_is_stronger() -> None:
    rep = _match_report(10, 0, 0, 5)
    line = _ending(_tournament("h1", "LLR 3.0 outside [-2.9, 2.9]"), rep)
    assert line.startswith("H1 accepted — mcts is stronger than random (Elo +120.0 ± 30.0)")
    line = _ending(_tournament("h0", "LLR -3.0 outside [-2.9, 2.9]"), rep)
    assert line.startswith("H0 accepted — mcts is not 10 Elo stronger than random"), line
    assert _ending(_tournament("max-pairs", "undecided"), rep).startswith("undecided")
    assert _ending(_tournament("completed", "6 games", "round-robin"), rep) == "completed 6 games"


def test_every_sprt_option_has_help() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "services.cli", "match", "--help"],
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    text = " ".join(done.stdout.split())
    for option, words in [
        ("--alpha ALPHA", "H1 when H0"), ("--beta BETA", "H0 when H1"),
        ("--model {normalized,logistic,bayeselo}", "ELO0,ELO1"), ("--max-pairs MAX_PAIRS", "pairs"),
    ]:  # fmt: skip
        after = text.split(option, 2)[-1][:120]
        assert words in after, (option, after)


def test_piped_output_is_not_wrapped_at_80_columns() -> None:
    console = make_console()  # pytest captures stdout: not a terminal
    assert not console.is_terminal
    assert console.width == PIPED_WIDTH


def test_in_a_terminal_log_records_go_through_the_console() -> None:
    console = Console(file=io.StringIO(), force_terminal=True, width=120)
    root = logging.getLogger()
    before = root.handlers[:]
    with logging_to(console):
        (handler,) = root.handlers
        assert isinstance(handler, RichHandler) and handler.console is console
    assert root.handlers == before
    with logging_to(Console(file=io.StringIO())):  # not a terminal: nothing changes
        assert root.handlers == before


def test_ready_lines_show_without_v_as_info() -> None:
    shown = _Announcements()
    ready = logging.LogRecord("agon.bus", logging.WARNING, "", 0, "%s ready: x", ("e",), None)
    said = logging.LogRecord("agon.runtime", logging.WARNING, "", 0, "e waits", (), None)
    said.announce = True
    warning = logging.LogRecord("agon.bus", logging.WARNING, "", 0, "Redis away", (), None)
    for record in (ready, said, warning):
        assert shown.filter(record)
    assert (ready.levelname, said.levelname, warning.levelname) == ("INFO", "INFO", "WARNING")


def test_a_piped_tournament_run_prints_progress_as_it_goes() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.cli", "tournament", "run", "--format", "round-robin",
         "--game", "teeko", "--bots", "mcts,greedy,random", "--move-time", "0.2"],
        cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    progress: list[float] = []
    with proc:
        for line in proc.stdout:
            if line.startswith("games ") and " ended; points: " in line:
                progress.append(time.monotonic())
        ended = time.monotonic()
        assert proc.wait(timeout=60) == 0, proc.stderr.read() if proc.stderr else ""
        err = proc.stderr.read() if proc.stderr else ""
    assert len(progress) >= 2, "no progress lines"
    assert ended - progress[0] > 0.5, "the first progress line came only at the end"
    assert " WARNING " not in err and " ready: " in err, err
