"""Random-simulation invariants over every game and option family (no Redis).

For seeded random games: legal actions are unique and ascending and empty exactly
when the state is terminal; notation and action codes round-trip; a clone evolves
identically; a snapshot round-trips through JSON; the checked path refuses an
illegal move and leaves the state as it was.
"""

from __future__ import annotations

import json
import random

import pytest

from engine import IllegalMoveError, InvalidMoveError, Move, State, load_game
from tests.support.families import family_id, option_families

FAMILIES = option_families()
GAMES_PER_FAMILY = 3


def _snapshot(state: State) -> str:
    return json.dumps(state.to_dict(), sort_keys=True)


def _check_position(state: State) -> None:
    game = state.game
    actions = state.legal_actions()
    assert actions == sorted(set(actions)), "legal actions must be unique and ascending"
    assert (not actions) == state.is_terminal, "terminal exactly when there is no legal move"
    assert (state.outcome() is not None) == state.is_terminal
    moves = state.legal_moves()
    assert [game.action_of(m) for m in moves] == actions
    for move in moves:
        assert Move.parse(str(move)) == move
        assert Move.parse(str(move).lower()) == move, "parsing is case-insensitive"


@pytest.mark.parametrize(("name", "options"), FAMILIES, ids=[family_id(*f) for f in FAMILIES])
def test_random_games_keep_invariants(name: str, options: dict[str, str]) -> None:
    game = load_game(name, **options)
    for seed in range(GAMES_PER_FAMILY):
        rng = random.Random(seed)
        state = game.new_initial_state()
        shadow: State | None = None
        fork_at = rng.randrange(1, 30)
        while True:
            _check_position(state)
            restored = game.state_from_dict(json.loads(json.dumps(state.to_dict())))
            assert _snapshot(restored) == _snapshot(state)
            assert restored.legal_actions() == state.legal_actions()
            if state.is_terminal:
                break
            if state.ply == fork_at:
                shadow = state.clone()
            action = rng.choice(state.legal_actions())
            state.apply_action(action)
            if shadow is not None:
                shadow.apply(game.move_of(action))
                assert _snapshot(shadow) == _snapshot(state), "a clone evolves identically"
        outcome = state.outcome()
        assert outcome is not None and outcome.winner in (0, 1, 2)


def _has_own_is_legal(name: str, options: dict[str, str]) -> bool:
    state = load_game(name, **options).new_initial_state()
    return type(state).is_legal is not State.is_legal


#: Families whose game answers `is_legal` itself rather than from `legal_actions()`.
OWN_IS_LEGAL = [f for f in FAMILIES if _has_own_is_legal(*f)]


def test_chains_games_answer_is_legal_themselves() -> None:
    assert {name for name, _ in OWN_IS_LEGAL} >= {"supply-chains", "supplier-sabotage"}


@pytest.mark.parametrize(
    ("name", "options"), OWN_IS_LEGAL, ids=[family_id(*f) for f in OWN_IS_LEGAL]
)
def test_is_legal_agrees_with_legal_actions(name: str, options: dict[str, str]) -> None:
    """A game's own `is_legal` answers exactly `action in legal_actions()`, every ply.

    Candidates are every action code below 2n+2 (for the chains games, placements,
    removals, pass and one past it: the whole action space) plus -1 and each legal one;
    a restored snapshot, whose caches are empty, must answer the same.
    """
    game = load_game(name, **options)
    for seed in range(GAMES_PER_FAMILY):
        rng = random.Random(1000 + seed)
        state = game.new_initial_state()
        while True:
            legal = state.legal_actions()
            candidates = set(range(-1, 2 * game.board.num_sites + 2)) | set(legal)
            views = [state]
            if state.ply % 5 == 0:
                views.append(game.state_from_dict(json.loads(json.dumps(state.to_dict()))))
            for view in views:
                answered = sorted(a for a in candidates if view.is_legal(a))
                assert answered == legal, f"ply {state.ply} of seed {seed}: {view.to_dict()}"
            if not legal:
                break
            state.apply_action(rng.choice(legal))


@pytest.mark.parametrize("name", sorted({f[0] for f in FAMILIES}))
def test_checked_apply_rejects_and_changes_nothing(name: str) -> None:
    state = load_game(name).new_initial_state()
    before = _snapshot(state)
    with pytest.raises(InvalidMoveError):
        state.apply("Z99")
    with pytest.raises(InvalidMoveError):
        state.apply("not a move")
    legal = {str(m) for m in state.legal_moves()}
    candidates = ["pass", "swap", "xA1", "A1-A2", "A1>N", "A1"]
    illegal = next(c for c in candidates if c not in legal)
    with pytest.raises((IllegalMoveError, InvalidMoveError)):
        state.apply(illegal)
    assert _snapshot(state) == before


def test_unknown_game_and_option_name_what_is_accepted() -> None:
    with pytest.raises(ValueError, match=r"accepted: .*supply-chains"):
        load_game("chess")
    with pytest.raises(ValueError, match="accepted: board"):
        load_game("supply-chains", colour="red")
    with pytest.raises(ValueError, match="hex-3-5"):
        load_game("supply-chains", board="hex-9-9")
