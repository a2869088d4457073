"""Golden playthroughs: one seeded random game per game and option family, drawn as text.

Each transcript shows, per ply, the board, the player to move, the legal moves and
the chosen move, then the outcome. `make golden` (python -m tests.support.golden regenerate)
rewrites them after an intended rules change; `tests/engine/test_golden.py` replays and
diffs them, and fails when a family has none.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

from engine import load_game
from tests.support.families import family_id, option_families

GOLDEN_DIR = Path(__file__).resolve().parents[1] / "golden"
SEED = 20261122


def transcript(name: str, options: dict[str, str], seed: int = SEED) -> str:
    game = load_game(name, **options)
    state = game.new_initial_state()
    rng = random.Random(seed)
    out = [f"# {game!r}, seed {seed}"]
    while not state.is_terminal:
        legal = state.legal_moves()
        move = rng.choice(legal)
        out.append(f"\nply {state.ply}, player {state.current_player} to move")
        out.append(state.render())
        out.append(f"legal ({len(legal)}): {' '.join(map(str, legal))}")
        out.append(f"chosen: {move}")
        state.apply(move)
    out.append("\nfinal")
    out.append(state.render())
    out.append(f"outcome: {state.outcome()}")
    return "\n".join(out) + "\n"


def golden_path(name: str, options: dict[str, str]) -> Path:
    return GOLDEN_DIR / f"{family_id(name, options)}.txt"


def regenerate() -> None:
    GOLDEN_DIR.mkdir(exist_ok=True)
    for name, options in option_families():
        path = golden_path(name, options)
        path.write_text(transcript(name, options))
        print(f"wrote {path}")


if __name__ == "__main__":
    if sys.argv[1:] != ["regenerate"]:
        sys.exit("usage: python -m tests.support.golden regenerate")
    regenerate()
