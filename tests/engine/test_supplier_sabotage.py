"""Supplier Sabotage (RULES.md §2) without Redis: the pattern warehouses, the turn of
placement then removals (own deficits first, then the opponent's), the last-removal cell
ban that never lapses, the end on two passes and its piece-count tie-break; the engine
against the plain model; and a replay of Ludii's default trial file.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from engine import Outcome, load_game
from engine.boards import load_board
from engine.games.chains import BitGrid, compile_walk, pattern_sites, split_chains
from engine.games.supplier_sabotage import SupplierSabotage, SupplierSabotageState
from engine.pattern import is_pattern
from tests.engine.test_supply_chains import (
    TRIALS,
    PlainModel,
    labels,
    moves,
    play,
    position,
    replay_trial_file,
)

PATTERNS = Path(__file__).resolve().parents[3] / "shared" / "conformance" / "patterns"

#: hex-3-5, top row first: E7-G7 / D6-G6 / C5-G5 / B4-G4 / A3-G3 / A2-F2 / A1-E1
EMPTY_HEX_3_5 = [". " * 3, ". " * 4, ". " * 5, ". " * 6, ". " * 7, ". " * 6, ". " * 5]


def hex_rows(**rows: str) -> list[str]:
    """The empty hex-3-5 picture with some rows replaced, by row number (`r2="..."`)."""
    out = list(EMPTY_HEX_3_5)
    for key, text in rows.items():
        out[6 - int(key[1:])] = text
    return out


def ss_model(game: SupplierSabotage) -> PlainModel:
    """The plain model with Ludii's own Pattern walk (engine.pattern's reference)."""
    board = game.board

    def is_warehouse(occ: str, s: int) -> bool:
        occupant = [0 if ch == "." else int(ch) for ch in occ]
        return is_pattern(board, game.warehouse_walk, s, occupant)

    return PlainModel(board, game.chain_relation, is_warehouse)


def ss_plain_legal(game: SupplierSabotage, state: SupplierSabotageState) -> list[str]:
    model = ss_model(game)
    occ = state.board_string()
    mover = state.current_player
    if state.prev == mover:
        deficit = model.deficit_warehouses(occ, mover) or model.deficit_warehouses(occ, 3 - mover)
        return ["x" + label for label in labels(game, deficit)]
    banned = state.banned[mover]
    return [game.board.labels[e] for e, ch in enumerate(occ) if ch == "." and e != banned] + [
        "pass"
    ]


# -- warehouses -------------------------------------------------------------------------------


def test_hex_warehouses_are_corners_of_friendly_triangles() -> None:
    game = load_game("supplier-sabotage")
    # B2 C2 C3 is a triangle (three mutually adjacent cells); E3 F3 G3 is only a line.
    state = position(game, hex_rows(r2=". . 1 . 1 1 1", r1=". 1 1 . . ."))
    assert labels(game, [s for c in state.display().chains for s in c.warehouses]) == [
        "B2",
        "C2",
        "C3",
    ]


def test_square_warehouses_are_l_corners_not_straight_lines() -> None:
    game = load_game("supplier-sabotage", board="square-5")
    rows = [
        ". . . . .",
        "1 1 1 . .",
        ". . . . .",
        ". 1 . . 1",
        ". 1 1 . 1",
    ]
    state = position(game, rows)
    warehouses = sorted(s for c in state.display().chains for s in c.warehouses)
    # B1 has N (B2) and E (C1): an L corner. A4-B4-C4 and E1-E2 are straight: none.
    assert labels(game, warehouses) == ["B1"]


@pytest.mark.parametrize("name", ["hex-3-5", "hex-8", "square-5", "square-8"])
def test_compiled_walks_agree_with_ludiis_verdicts(name: str) -> None:
    path = PATTERNS / f"{name}.jsonl"
    if not path.is_file():
        pytest.skip("../shared/conformance not present (outside the project)")
    grid = BitGrid(load_board(name), pad=6)  # `F F F F F` reaches 5 columns away
    checked = 0
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if "walk" not in record:
            continue
        walk = compile_walk(grid, record["walk"])
        found = 0
        for colour in "12":
            pieces = sum(grid.bit[s] for s, ch in enumerate(record["position"]) if ch == colour)
            found |= pattern_sites(pieces, walk)
        assert grid.sites(found) == record["true_sites"], (record["walk"], record["seed"])
        checked += 1
    assert checked >= 150


# -- the turn -----------------------------------------------------------------------------------


def test_own_deficits_are_removed_first_then_the_opponents() -> None:
    game = load_game("supplier-sabotage")
    # P2's triangle D4 E4 E5 lives on P1's suppliers C3 D3 E3.
    state = position(game, hex_rows(r4=". . 2 . .", r3=". . 2 2 . .", r2=". . 1 1 1 . ."))
    # D2 makes D2 D3 E3 a P1 triangle: P1's chain starves (no P2 supplier is left around
    # it) and so does P2's (only C3 still supplies it).
    state.apply("D2")
    assert state.current_player == 1
    assert moves(state) == ["xD2", "xD3", "xE3"]  # own deficit warehouses only
    other = state.clone()
    other.apply("xD2")  # the line C3 D3 E3 is back: nobody is in deficit
    assert other.current_player == 2 and "pass" in moves(other)
    state.apply("xD3")  # P1's deficit is gone, P2's (suppliers C3, E3) is not
    assert state.current_player == 1
    assert moves(state) == ["xD4", "xE4", "xE5"]  # now the opponent's, by the mover
    state.apply("xE4")
    assert state.current_player == 2
    assert state.banned == [-1, game.board.site("D3"), -1]  # a capture bans nothing
    assert "E4" in moves(state) and "D3" in moves(state)


def test_the_last_self_removal_cell_stays_banned() -> None:
    game = load_game("supplier-sabotage")
    state = game.new_initial_state()
    play(state, "B2 G5 C2 E7 C3")  # P1's triangle B2 C2 C3 has no supplier around
    assert state.current_player == 1 and moves(state) == ["xB2", "xC2", "xC3"]
    state.apply("xC2")
    assert state.current_player == 2 and "C2" in moves(state)
    state.apply("pass")
    assert "C2" not in moves(state) and "B1" in moves(state) and moves(state)[-1] == "pass"
    play(state, "A1 pass")
    assert "C2" not in moves(state)  # two turns later: Ludii never lifts the ban
    play(state, "A3 G7")
    assert "C2" not in moves(state)
    state.apply("pass")
    state.apply("C2")  # the opponent may take the cell
    assert state.board_string()[game.board.site("C2")] == "2"


def test_two_single_passes_end_it_and_equal_warehouses_go_to_piece_count() -> None:
    game = load_game("supplier-sabotage")
    state = position(game, hex_rows(r2="1 . 1 . 1 . .", r0=". . 2 . 2"))
    play(state, "pass B1 pass")  # a placement in between: not two passes in a row
    assert not state.is_terminal
    assert state.scores() == (0, 0)  # warehouses while the game goes on
    state.apply("pass")
    assert state.legal_actions() == []
    # B1 made the piece counts equal too: a draw, scored by pieces.
    assert state.outcome() == Outcome(0, (3, 3), "all-passed")
    assert state.scores() == (3, 3)
    state = position(game, hex_rows(r2="1 . 1 . 1 . .", r0=". . 2 . 2"))
    play(state, "pass pass")
    assert state.outcome() == Outcome(1, (3, 2), "all-passed")  # pieces decide: 3 to 2


def test_more_warehouses_win_even_with_fewer_pieces() -> None:
    game = load_game("supplier-sabotage")
    # P1's triangle B2 C2 C3 (3 warehouses) is supplied by P2's A1, C1, D3.
    rows = hex_rows(r6="2 . 2", r2=". . 1 2 . . .", r1=". 1 1 . . .", r0="2 . 2 . .")
    state = position(game, rows)
    assert state.scores() == (3, 0)
    play(state, "pass pass")
    assert state.outcome() == Outcome(1, (3, 0), "all-passed")


def test_square_option_counts_diagonal_suppliers() -> None:
    ortho = load_game("supplier-sabotage", board="square-5")
    square = load_game("supplier-sabotage", board="square-5", connectivity="square-option")
    rows = [
        ". . . . .",
        ". . . . .",
        ". . 2 . .",
        "1 1 . . .",
        "1 2 . . .",
    ]
    # A2 is an L corner (A1 south, B2 east); P2's C3 touches B2 only diagonally.
    for game, suppliers in ((ortho, ["B1"]), (square, ["B1", "C3"])):
        state = position(game, rows)
        chain = next(c for c in state.display().chains if c.owner == 1)
        assert labels(game, chain.warehouses) == ["A2"]
        assert labels(game, chain.suppliers_around) == suppliers


def test_surplus_values_are_written_clamped_at_zero() -> None:
    game = load_game("supplier-sabotage")
    site = game.board.site
    # P1's triangle B2 C2 C3 with four suppliers around: surplus 1 on each piece.
    rows = hex_rows(r2=". 2 1 2 . . .", r1=". 1 1 . . .", r0="2 . 2 . .")
    values = position(game, rows).surplus_values()
    assert [values[site(c)] for c in ("B2", "C2", "C3", "A1")] == [1, 1, 1, 0]
    assert values[site("E1")] is None
    # With two suppliers the chain is in deficit (surplus -1), which Ludii writes as 0.
    rows = hex_rows(r1=". 1 1 . . .", r2=". . 1 . . . .", r0="2 . 2 . .")
    state = position(game, rows, prev=1)
    chain = next(c for c in state.display().chains if c.owner == 1)
    assert chain.surplus == -1 and moves(state) == ["xB2", "xC2", "xC3"]
    assert {state.surplus_values()[s] for s in chain.cells} == {0}


# -- the engine against the plain model -------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [{}, {"board": "square-5"}, {"board": "square-7", "connectivity": "square-option"}],
    ids=lambda o: "-".join(o.values()) or "default",
)
def test_engine_agrees_with_the_plain_model_on_random_games(options: dict[str, str]) -> None:
    game = load_game("supplier-sabotage", **options)
    assert isinstance(game, SupplierSabotage)
    model = ss_model(game)
    rng = random.Random(11)
    for _ in range(3):
        state = game.new_initial_state()
        while not state.is_terminal:
            model.check_display(state)
            assert moves(state) == ss_plain_legal(game, state)
            for colour in (1, 2):
                fresh = split_chains(state.pieces[colour], game.shifts, game.valid)
                assert sorted(state.chains[colour]) == sorted(fresh)
            legal = state.legal_actions()
            # Passing less often than Ludii's uniform choice gives fuller boards.
            placing = [a for a in legal if a != game.pass_action] or legal
            state.apply_action(rng.choice(placing if rng.random() < 0.9 else legal))


def test_snapshot_round_trips() -> None:
    game = load_game("supplier-sabotage")
    state = game.new_initial_state()
    play(state, "B2 G5 C2 E7 C3 xC2")
    data = json.loads(json.dumps(state.to_dict()))
    restored = game.state_from_dict(data)
    assert restored.to_dict() == state.to_dict() == data
    assert data["banned"] == [game.board.site("C2"), -1]
    assert restored.legal_actions() == state.legal_actions()


def test_replays_ludiis_default_trials() -> None:
    assert replay_trial_file(TRIALS / "supplier-sabotage_default.jsonl") > 1000
