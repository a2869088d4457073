"""The engine contract every game shares (DESIGN.md, the engine; no Redis).

- Every end of a game is named by a member of the closed `EndRule`, which serialises as
  plain text; every member is one that some game produces.
- The move limit is `engine.core.MAX_PLIES`, in one place, and every game ends there.
- `State.display()` is the surplus display for the chains games and None for the others.
"""

from __future__ import annotations

import ast
import json
import random
from pathlib import Path

import msgpack
import pytest

from engine import MAX_PLIES, EndRule, Game, Move, Outcome, State, game_names, load_game
from engine.positions import Positions
from tests.support.families import family_id, option_families
from tests.support.source import parse

ENGINE = Path(__file__).resolve().parents[2] / "engine"
FAMILIES = option_families()
FAMILY_IDS = [family_id(*f) for f in FAMILIES]
PLAYOUTS_PER_FAMILY = 2
#: the games that show a surplus display beside the pieces
DISPLAY_GAMES = {"supply-chains", "supplier-sabotage"}


def playout(game: Game, seed: int) -> State:
    """A uniformly random game to its end, on the unchecked path."""
    rng = random.Random(seed)
    state = game.new_initial_state()
    while not state.is_terminal:
        state.apply_action(rng.choice(state.legal_actions()))
    return state


# -- the end rules ------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "options"), FAMILIES, ids=FAMILY_IDS)
def test_every_end_of_a_random_game_is_an_end_rule(name: str, options: dict[str, str]) -> None:
    game = load_game(name, **options)
    for seed in range(PLAYOUTS_PER_FAMILY):
        state = playout(game, seed)
        # the state itself holds a member, not a look-alike string
        assert type(state.reason) is EndRule, f"{name} seed {seed}: reason {state.reason!r}"
        outcome = state.outcome()
        assert outcome is not None and type(outcome.reason) is EndRule
        assert outcome.reason is state.reason
        # serialised, the reason is exactly the rule's text
        data = outcome.to_dict()
        assert type(data["reason"]) is str and data["reason"] == outcome.reason.value
        assert json.loads(json.dumps(data)) == data
        assert msgpack.unpackb(msgpack.packb(data)) == data
        snapshot = state.to_dict()
        assert type(snapshot["reason"]) is str and snapshot["reason"] == outcome.reason.value
        assert game.state_from_dict(snapshot).reason is state.reason


def test_a_game_in_progress_has_no_end_rule() -> None:
    for name in game_names():
        state = load_game(name).new_initial_state()
        assert state.reason is None and state.outcome() is None and not state.is_terminal
        assert state.to_dict()["reason"] == ""


def test_every_end_rule_is_one_a_game_produces() -> None:
    """The enum is closed both ways: no member is named by nothing in the games."""
    named = set()
    for path in ENGINE.rglob("*.py"):
        if path.name == "core.py" and path.parent == ENGINE:
            continue  # the definition itself
        for node in ast.walk(parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "EndRule"
            ):
                named.add(node.attr)
    assert {m.name for m in EndRule} <= named, "members that no game produces"
    assert named - {"from_text"} <= {m.name for m in EndRule}


def test_end_rules_read_and_write_as_their_old_texts() -> None:
    assert EndRule.MOVE_LIMIT == "move-limit" and f"{EndRule.LINE}" == "line"
    assert Outcome(1, None, "line") == Outcome(1, None, EndRule.LINE)  # type: ignore[arg-type]
    assert repr(Outcome(0, (3, 3), EndRule.ALL_PASSED)) == (
        "Outcome(winner=0, scores=(3, 3), reason='all-passed')"
    )
    assert EndRule.from_text("") is None and EndRule.from_text("ring") is EndRule.RING
    with pytest.raises(ValueError):
        Outcome(1, None, "resigned")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        EndRule.from_text("stalemate")


# -- the move limit ---------------------------------------------------------------------------


def _quiet_position(game: Game) -> tuple[State, int]:
    """A position a few plies in and an action that does not end the game there."""
    for seed in range(50):
        rng = random.Random(seed)
        state = game.new_initial_state()
        for _ in range(4):  # past any opening rule (Hexade's swap at ply 1)
            if state.is_terminal:
                break
            state.apply_action(rng.choice(state.legal_actions()))
        if state.is_terminal:
            continue
        for action in state.legal_actions():
            after = state.clone()
            after.apply_action(action)
            if not after.is_terminal:
                return state, action
    raise AssertionError(f"no quiet position found in {game!r}")


@pytest.mark.parametrize(("name", "options"), FAMILIES, ids=FAMILY_IDS)
def test_every_game_ends_at_the_one_move_limit(name: str, options: dict[str, str]) -> None:
    game = load_game(name, **options)
    state, action = _quiet_position(game)

    early = state.clone()
    early.ply = MAX_PLIES - 2
    early.apply_action(action)
    assert early.ply == MAX_PLIES - 1
    assert not early.is_terminal, f"{name} ended before MAX_PLIES ({MAX_PLIES}) plies"

    limit = state.clone()
    limit.ply = MAX_PLIES - 1
    limit.apply_action(action)
    assert limit.ply == MAX_PLIES
    assert limit.is_terminal, f"{name} goes on after MAX_PLIES ({MAX_PLIES}) plies"
    assert limit.reason is EndRule.MOVE_LIMIT and limit.legal_actions() == []
    outcome = limit.outcome()
    assert outcome is not None and (outcome.winner, outcome.reason) == (0, EndRule.MOVE_LIMIT)


def test_the_move_limit_is_defined_once() -> None:
    """Only engine/core.py binds MAX_PLIES or writes 2500; every other module imports it."""
    offending = []
    for path in sorted(ENGINE.rglob("*.py")):
        where = path.relative_to(ENGINE.parent).as_posix()
        if where == "engine/core.py":
            continue
        for node in ast.walk(parse(path.read_text(encoding="utf-8"))):
            line = getattr(node, "lineno", 0)
            if isinstance(node, ast.Constant) and node.value == MAX_PLIES:
                offending.append(f"{where}:{line}: the literal {MAX_PLIES}")
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                if "MAX_PL" in node.id.upper():
                    offending.append(f"{where}:{line}: binds {node.id}")
            elif isinstance(node, ast.ImportFrom):
                imported = {alias.name for alias in node.names}
                if "MAX_PLIES" in imported and node.module != "engine.core":
                    offending.append(f"{where}:{line}: MAX_PLIES from {node.module}")
    assert not offending, "\n".join(offending)


# -- the display -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", game_names())
def test_display_is_part_of_the_contract(name: str) -> None:
    game = load_game(name)
    rng = random.Random(3)
    state = game.new_initial_state()
    for _ in range(12):
        if state.is_terminal:
            break
        state.apply_action(rng.choice(state.legal_actions()))
    display = state.display()
    if name in DISPLAY_GAMES:
        assert display is not None, f"{name} shows a surplus display"
        shown = json.loads(json.dumps(display.to_dict()))
        assert set(shown) == {"chains", "deficit_warehouses", "surplus_values"}
        assert shown["chains"], "a dozen plies in there are chains"
    else:
        assert display is None, f"{name} has no display"
        assert type(state).display is State.display


def test_every_display_game_is_registered() -> None:
    assert set(game_names()) >= DISPLAY_GAMES
    assert len(set(game_names()) - DISPLAY_GAMES) == 3


def test_positions_replay_only_new_moves_and_agree_with_a_full_replay() -> None:
    """`engine.positions`: the position after a growing move list is the full replay's; a
    shorter list (a game replayed from its start) starts again; at most `size` are kept."""
    positions = Positions(size=2)
    game = load_game("teeko")
    state, moves = game.new_initial_state(), []
    for _ in range(12):
        move = str(state.legal_moves()[0])
        state.apply(Move.parse(move))
        moves.append(move)
        kept = positions.after("g", "teeko", {}, moves)
        assert kept.to_dict() == state.to_dict()
    assert positions.after("g", "teeko", {}, moves[:3]).to_dict() != state.to_dict()
    for gid in ("a", "b"):
        positions.after(gid, "teeko", {}, [])
    assert "g" not in positions._states and len(positions._states) == 2
