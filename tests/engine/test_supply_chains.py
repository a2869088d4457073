"""Supply Chains (RULES.md §1) without Redis: the rules that are easy to get wrong, each on a
hand-built position or move sequence; the bitboard engine against a plain set-and-BFS model
of the rules on random positions; and a replay of Ludii's default trial file.

The plain model and the trial checker here are shared with test_supplier_sabotage.py.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from engine import IllegalMoveError, Move, Outcome, load_game
from engine.boards import Board, Relation
from engine.core import MAX_PLIES, SNAPSHOT_VERSION, Game
from engine.games.chains import ChainsState, split_chains
from engine.games.supply_chains import SupplyChains, SupplyChainsState

SHARED = Path(__file__).resolve().parents[3] / "shared"
TRIALS = SHARED / "conformance" / "trials"


# -- helpers: positions from pictures, moves in notation --------------------------------------


def board_text(rows: Sequence[str]) -> str:
    """A board string from a picture drawn top row first, cells left to right in each row."""
    return "".join("".join(row.split()) for row in reversed(rows))


def position(game: Game, rows: Sequence[str], **fields: Any) -> Any:
    """A state of `game` with the pictured board; other snapshot fields from `fields`."""
    board = board_text(rows)
    data: dict[str, Any] = {
        "version": SNAPSHOT_VERSION,
        "game": game.name,
        "options": dict(game.options),
        "ply": 10,
        "board": board,
        "mover": 1,
        "reason": "",
        "passed": [False, False],
    }
    if game.name == "supply-chains":
        data.update(turn_var=0, values=[None if c == "." else 0 for c in board])
    else:
        data.update(prev=0, banned=[-1, -1])
    data.update(fields)
    return game.state_from_dict(data)


def moves(state: Any) -> list[str]:
    return [str(m) for m in state.legal_moves()]


def play(state: Any, text: str) -> None:
    for move in text.split():
        state.apply(move)


def labels(game: Game, sites: Sequence[int]) -> list[str]:
    return [game.board.labels[s] for s in sites]


# -- a plain model of both games' definitions: sets and breadth-first search ---------------


class PlainModel:
    """Chains, warehouses and deficits computed from scratch with sets, per RULES.md §1-§2.

    `is_warehouse` is the game's rule; everything else is shared, as in the two .lud files.
    """

    def __init__(self, board: Board, relation: Relation, is_warehouse: Callable[..., bool]):
        self.board = board
        self.nbrs = board.neighbours(relation)
        self.is_warehouse = is_warehouse

    def chain(self, occ: str, s: int) -> set[int]:
        seen, todo = {s}, [s]
        while todo:
            for t in self.nbrs[todo.pop()]:
                if t not in seen and occ[t] == occ[s]:
                    seen.add(t)
                    todo.append(t)
        return seen

    def chain_view(self, occ: str, s: int) -> tuple[set[int], set[int], set[int]]:
        """(chain, its warehouses, the distinct suppliers around it)."""
        chain = self.chain(occ, s)
        warehouses = {c for c in chain if self.is_warehouse(occ, c)}
        around = {t for c in chain for t in self.nbrs[c] if t not in chain and occ[t] != "."}
        suppliers = {t for t in around if not self.is_warehouse(occ, t)}
        return chain, warehouses, suppliers

    def in_deficit(self, occ: str, s: int) -> bool:
        _, warehouses, suppliers = self.chain_view(occ, s)
        return len(suppliers) < len(warehouses)

    def deficit_warehouses(self, occ: str, colour: int) -> list[int]:
        return [
            s
            for s, ch in enumerate(occ)
            if ch == str(colour) and self.is_warehouse(occ, s) and self.in_deficit(occ, s)
        ]

    def check_display(self, state: ChainsState) -> None:
        """The engine's chains, warehouses, suppliers and deficit sets equal the model's."""
        occ = state.board_string()
        shown = {c.cells: c for c in state.display().chains}
        occupied = [s for s, ch in enumerate(occ) if ch != "."]
        assert sorted(s for cells in shown for s in cells) == occupied
        for cells, info in shown.items():
            chain, warehouses, suppliers = self.chain_view(occ, cells[0])
            assert set(cells) == chain and info.owner == int(occ[cells[0]])
            assert set(info.warehouses) == warehouses
            assert set(info.suppliers_around) == suppliers
            assert info.surplus == len(suppliers) - len(warehouses)
        deficit = state.display().deficit_warehouses
        assert [list(d) for d in deficit] == [self.deficit_warehouses(occ, c) for c in (1, 2)]


def sc_model(game: SupplyChains) -> PlainModel:
    nbrs = game.board.neighbours(game.chain_relation)

    def is_warehouse(occ: str, s: int) -> bool:
        return sum(occ[t] == occ[s] for t in nbrs[s]) >= 3

    return PlainModel(game.board, game.chain_relation, is_warehouse)


def sc_plain_legal(game: SupplyChains, state: SupplyChainsState) -> list[str]:
    """Supply Chains' legal moves from the definitions: removal priority, then placements."""
    model = sc_model(game)
    occ = state.board_string()
    mover = state.current_player
    remover = 3 - mover if game.capture else mover
    deficit = model.deficit_warehouses(occ, remover)
    if deficit:
        return ["x" + label for label in labels(game, deficit)]
    out = []
    for e, ch in enumerate(occ):
        after = occ[:e] + str(mover) + occ[e + 1 :]
        if ch == "." and not model.in_deficit(after, e):
            out.append(game.board.labels[e])
    if game.passing:
        out.append("pass")
    return out or ["pass"]


# -- a small Ludii trial checker (the general runner is services/cli/conformance.py) -----------


def ludii_to_agon(board: Board, text: str) -> str:
    if text == "Pass":
        return "pass"
    if text.startswith("Add@"):
        return board.labels[int(text[4:])]
    if text.startswith("Remove@"):
        return "x" + board.labels[int(text[7:])]
    if text.startswith("Select "):
        frm, to = text[7:].split("->")
        assert frm == to
        return "x" + board.labels[int(frm)]
    raise ValueError(f"not a chains-game move: {text!r}")


def replay_trial_file(path: Path) -> int:
    """Replay every playout of a trial file; assert each ply and result; return plies seen."""
    if not path.is_file():
        pytest.skip("../shared/conformance not present (outside the project)")
    plies = 0
    for line in path.read_text().splitlines():
        trial = json.loads(line)
        game = load_game(trial["agon"]["game"], **trial["agon"]["options"])
        state = game.new_initial_state()
        for ply in trial["plies"]:
            where = f"{path.name} playout {trial['playout']} ply {ply['ply']}"
            assert not state.is_terminal, where
            assert state.current_player == ply["mover"], where
            expected = {ludii_to_agon(game.board, t) for t in ply["legal"]}
            assert set(moves(state)) == expected, where
            state.apply(ludii_to_agon(game.board, ply["move"]))
            assert state.board_string() == ply["board_after"], where
            assert list(state.scores()) == ply["scores_after"], where
            plies += 1
        outcome = state.outcome()
        assert state.is_terminal and outcome is not None, path.name
        assert outcome.winner == trial["winner"], f"{path.name} playout {trial['playout']}"
        assert list(outcome.scores or ()) == trial["final_scores"]
    return plies


# -- the definitions ----------------------------------------------------------------------------

SQUARE_ORTHO = {"board": "square-8", "connectivity": "orthogonal"}


def test_a_supplier_touching_a_chain_twice_counts_once() -> None:
    game = load_game("supply-chains", **SQUARE_ORTHO)
    # C2 is a warehouse (B2, D2, C3); B3 is one foreign supplier touching B2 and C3.
    rows = [
        ". . . . . . . .",
        ". . . . . . . .",
        ". . . . . . . .",
        ". . . . . . . .",
        ". . . . . . . .",
        ". 2 1 1 . . . .",
        ". 1 1 1 . . . .",
        ". . . . . . . .",
    ]
    state = position(game, rows)
    (chain,) = [c for c in state.display().chains if c.owner == 1]
    assert labels(game, chain.suppliers_around) == ["B3"]
    assert labels(game, chain.warehouses) == ["C2"] and chain.surplus == 0
    # E3 would make D3 a second warehouse: 2 warehouses > 1 supplier, so it is illegal.
    legal = moves(state)
    assert "E3" not in legal and "D4" not in legal and "E2" not in legal
    assert "A2" in legal and "F5" in legal
    # A second, distinct supplier (B1, next to B2) pays for the second warehouse.
    rows[7] = ". 2 . . . . . ."
    assert "E3" in moves(position(game, rows))


def test_removals_take_priority_and_protocol_waits_for_the_last_one() -> None:
    game = load_game("supply-chains", **SQUARE_ORTHO)
    # Two plus shapes of P1 with no supplier around: C3 and F6 are deficit warehouses.
    rows = [
        ". . . . . . . .",
        ". . . . . 1 . .",
        ". . . . 1 1 1 .",
        ". . . . . 1 . .",
        ". . 1 . . . . .",
        ". 1 1 1 . . . .",
        ". . 1 . . . . .",
        ". . . . . . . .",
    ]
    state = position(game, rows, mover=1, turn_var=0)  # P1 starts its pair of turns
    assert moves(state) == ["xC3", "xF6"]  # only removals, although the board is empty
    state.apply("xF6")
    assert (state.current_player, state.turn_var) == (1, 0)  # still removing: no protocol
    assert moves(state) == ["xC3"]
    state.apply("xC3")
    # The whole removal sequence was P1's first turn; the second one is a placement.
    assert (state.current_player, state.turn_var) == (1, 1)
    legal = moves(state)
    assert not any(m.startswith("x") for m in legal) and "A1" in legal
    assert "C3" not in legal  # it would rebuild a warehouse with no supplier around
    state.apply("H8")
    assert (state.current_player, state.turn_var) == (2, 0)
    play(state, "A8 B8")
    assert state.current_player == 1


def test_double_turn_protocol_from_the_start_and_plain_alternation() -> None:
    movers = []
    state = load_game("supply-chains").new_initial_state()
    assert state.turn_var == -1  # Ludii's unset var reads as Constants.OFF
    for move in ["A1", "C1", "E1", "A3", "C3", "E3", "G3", "C5"]:
        movers.append(state.current_player)
        state.apply(move)
    assert movers == [1, 2, 2, 1, 1, 2, 2, 1]
    state = load_game("supply-chains", variant="self-removal").new_initial_state()
    movers = []
    for move in ["A1", "C1", "E1", "A3"]:
        movers.append(state.current_player)
        state.apply(move)
    assert movers == [1, 2, 1, 2]


def test_first_forced_pass_ends_the_game_in_the_middle_of_a_double_turn() -> None:
    game = load_game("supply-chains", **SQUARE_ORTHO)
    rows = [
        "2 . . 2 2 2 2 2",
        "2 2 2 2 1 2 2 1",
        "1 2 . 2 2 2 1 1",
        "1 1 2 1 2 1 2 2",
        "2 1 1 1 2 1 2 2",
        "1 1 1 1 1 1 1 2",
        "1 2 2 1 1 1 1 2",
        "1 1 1 2 2 1 1 1",
    ]
    state = position(game, rows, mover=2, turn_var=0)  # P2's first ply of its pair
    assert moves(state) == ["B8", "C8"]
    state.apply("B8")
    assert state.current_player == 2 and not state.is_terminal
    assert moves(state) == ["pass"]  # C8 would starve P2's chain: Ludii's forced pass
    assert state.outcome() is None
    p1_view = state.clone()
    p1_view.mover = 1
    p1_view._legal = None
    assert moves(p1_view) == ["C6", "C8"]  # the opponent could still place
    state.apply("pass")
    assert state.is_terminal and state.legal_actions() == []
    outcome = state.outcome()
    assert outcome == Outcome(1, (12, 7), "no-moves")  # most warehouses, empties left
    assert state.board_string().count(".") == 2


def test_capture_variant_removes_the_opponents_warehouses_for_free() -> None:
    game = load_game("supply-chains", board="hex-3-4")
    capture = load_game("supply-chains", board="hex-3-4", variant="capture-122")
    opening = "C1 F4 D2 E4 B3 E2 F3 C2 C4 D4 E3 D3 A3 B4 B2 F6"
    # Self-removal: P1's C3 starves P2's chain (C2 and D3 become warehouses), and P2 pays
    # with the first turn of its pair.
    state = game.new_initial_state()
    play(state, opening + " C3")
    assert state.current_player == 2 and moves(state) == ["xE2", "xE3", "xF3"]
    # Capture: the same placement lets P1 remove P2's warehouses at once, and the protocol
    # (P1 was on the second ply of its pair) waits until the captures are done.
    state = capture.new_initial_state()
    play(state, opening)
    assert (state.current_player, state.turn_var) == (1, 1)
    state.apply("C3")
    assert (state.current_player, state.turn_var) == (1, 1)
    assert moves(state) == ["xE2", "xE3", "xF3"]
    state.apply("xE3")
    assert state.board_string()[game.board.site("E3")] == "."
    assert (state.current_player, state.turn_var) == (2, 0)
    assert all(not m.startswith("x") for m in moves(state))


def test_surplus_display_keeps_a_stale_value_when_a_chain_falls_into_deficit() -> None:
    game = load_game("supply-chains", board="hex-3-4")
    state = game.new_initial_state()
    play(state, "C1 F4 D2 E4 B3 E2 F3 C2 C4 D4 E3 D3 A3 B4 B2 F6")
    site = game.board.site
    values = state.surplus_values()
    chain = next(c for c in state.display().chains if site("E2") in c.cells)
    assert chain.surplus == 1 and values[site("E2")] == 1
    state.apply("C3")  # two of the chain's suppliers become warehouses: surplus 1 -> -1
    chain = next(c for c in state.display().chains if site("E2") in c.cells)
    assert chain.surplus == -1 and chain.in_deficit
    values = state.surplus_values()
    assert {values[s] for s in chain.cells} == {1}  # never written, not clamped to 0
    big = next(c for c in state.display().chains if site("C3") in c.cells)
    assert big.surplus == 1 and {values[s] for s in big.cells} == {1}
    assert values[site("A1")] is None
    display = state.display()
    assert labels(game, display.deficit_warehouses[1]) == ["E2", "E3", "F3"]
    assert display.to_dict()["deficit_warehouses"] == {"1": [], "2": ["E2", "E3", "F3"]}
    # The stale value survives a snapshot and a clone.
    restored = game.state_from_dict(json.loads(json.dumps(state.to_dict())))
    assert restored.surplus_values() == values
    assert state.clone().surplus_values() == values
    # The removal ends the deficit and the chain's pieces show the fresh surplus again.
    state.apply("xE3")
    values = state.surplus_values()
    rest = next(c for c in state.display().chains if site("E2") in c.cells)
    assert rest.surplus == 2 and {values[s] for s in rest.cells} == {2}
    assert values[site("E3")] is None


def test_passing_variant_ends_when_both_players_pass_in_a_row() -> None:
    game = load_game("supply-chains", variant="passing")
    state = game.new_initial_state()
    assert moves(state)[-1] == "pass"
    play(state, "pass A1 pass")
    assert not state.is_terminal and state.current_player == 2
    state.apply("pass")
    outcome = state.outcome()
    assert outcome is not None and outcome.reason == "all-passed" and outcome.winner == 0
    assert outcome.scores == (0, 0)


def test_forced_variants_have_no_voluntary_pass_and_moves_are_checked() -> None:
    state = load_game("supply-chains").new_initial_state()
    assert "pass" not in moves(state)
    with pytest.raises(IllegalMoveError):
        state.apply("pass")
    with pytest.raises(IllegalMoveError):
        state.apply("xA1")
    state.apply("A1")
    with pytest.raises(IllegalMoveError, match="illegal move A1"):
        state.apply("A1")


def test_move_limit_is_a_draw() -> None:
    game = load_game("supply-chains", variant="passing")
    rows = ["1 1 1", "2 2 2 2", ". . . . .", ". " * 6, ". " * 7, ". " * 6, ". " * 5]
    state = position(game, rows)
    state.ply = MAX_PLIES - 1
    state.apply("pass")
    outcome = state.outcome()
    assert outcome is not None and (outcome.reason, outcome.winner) == ("move-limit", 0)


def test_options_are_ludiis_with_the_same_defaults() -> None:
    game = load_game("supply-chains")
    assert game.options == {
        "board": "hex-3-5",
        "connectivity": "adjacent",
        "variant": "self-removal-122",
    }
    assert load_game("supply-chains", board="hex-5-6").board.num_sites == 75
    with pytest.raises(ValueError, match="hex-3-5"):
        load_game("supply-chains", board="hex-4-6")
    with pytest.raises(ValueError, match="variant"):
        load_game("supply-chains", rules="x")


def test_action_codes_order_placements_removals_pass() -> None:
    game = load_game("supply-chains")
    n = game.board.num_sites
    assert [str(game.move_of(a)) for a in (0, n - 1, n, 2 * n - 1, 2 * n)] == [
        "A1",
        "G7",
        "xA1",
        "xG7",
        "pass",
    ]
    for action in (0, n + 5, 2 * n):
        assert game.action_of(game.move_of(action)) == action
    with pytest.raises(ValueError):
        game.action_of(Move("swap"))


# -- the engine against the plain model, and its incremental chains --------------------------


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"variant": "capture-122"},
        {"variant": "passing"},
        {"board": "square-8"},
        SQUARE_ORTHO,
        {"board": "hex-3-4", "connectivity": "orthogonal", "variant": "self-removal"},
    ],
    ids=lambda o: "-".join(o.values()) or "default",
)
def test_engine_agrees_with_the_plain_model_on_random_games(options: dict[str, str]) -> None:
    game = load_game("supply-chains", **options)
    assert isinstance(game, SupplyChains)
    model = sc_model(game)
    rng = random.Random(7)
    for _ in range(3):
        state = game.new_initial_state()
        while not state.is_terminal:
            model.check_display(state)
            assert moves(state) == sc_plain_legal(game, state)
            for colour in (1, 2):
                fresh = split_chains(state.pieces[colour], game.shifts, game.valid)
                assert sorted(state.chains[colour]) == sorted(fresh)
            state.apply_action(rng.choice(state.legal_actions()))


def test_snapshot_round_trips_and_clone_is_independent() -> None:
    game = load_game("supply-chains", variant="capture-122")
    state = game.new_initial_state()
    rng = random.Random(3)
    for _ in range(20):
        state.apply_action(rng.choice(state.legal_actions()))
    data = json.loads(json.dumps(state.to_dict()))
    restored = game.state_from_dict(data)
    assert restored.to_dict() == state.to_dict()
    assert restored.legal_actions() == state.legal_actions()
    twin = state.clone()
    twin.apply_action(twin.legal_actions()[0])
    assert twin.to_dict() != state.to_dict() and restored.to_dict() == state.to_dict()
    with pytest.raises(ValueError, match="options"):
        load_game("supply-chains").state_from_dict(data)


# -- Ludii ------------------------------------------------------------------------------------


def test_replays_ludiis_default_trials() -> None:
    assert replay_trial_file(TRIALS / "supply-chains_default.jsonl") > 1000
