"""Wire models and the codec: round trips, closed sets, and every way an entry can be bad."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import msgpack
import pytest
from pydantic import BaseModel, ValidationError

from schemas.codec import (
    MAX_ENTRY_BYTES,
    DecodeError,
    decode_command,
    decode_event,
    decode_reply,
    decode_turn,
    encode,
    encode_accepted,
    encode_map,
    event_hash,
    move_played_map,
    reply_address,
    schemas,
    unpack,
)
from schemas.commands import (
    Abort,
    ClaimTimeout,
    CreateGame,
    ImportGame,
    PlayMove,
    Resign,
    SeatPlayer,
    SeatSpec,
)
from schemas.events import GameCreated, GameEnded, GameStarted, MovePlayed, PlayerSeated
from schemas.replies import REJECT_CODES, Accepted, Rejected
from schemas.tokens import admin_token, bot_token, token_hash, token_matches, tokens_equal
from schemas.turns import TurnRequest
from services.cli import schemas as schemas_cmd

H = "ab" * 32
EV = {"game_id": "g1", "time": 5, "command_id": "c1"}

COMMANDS: list[BaseModel] = [
    CreateGame(
        command_id="c1",
        reply_to="agon:replies:cli",
        game_id="g1",
        game="teeko",
        options={"markers": "4"},
        seats=[SeatSpec(kind="human", name="ann"), SeatSpec(kind="bot", name="random")],
        move_time_ms=2000,
        seed=9,
    ),
    SeatPlayer(command_id="c2", game_id="g1", seat=1, name="ann"),
    PlayMove(command_id="c3", game_id="g1", seat=1, token="t", move="C4", expected_seq=4),
    Resign(command_id="c4", game_id="g1", seat=2, token="t"),
    ClaimTimeout(command_id="c5", game_id="g1", expected_seq=4),
    Abort(command_id="c6", game_id="g1", seat=0, token="t"),
    ImportGame(command_id="c7", game_id="g2", events=[{"v": 1, "type": "game_created"}]),
]
EVENTS: list[BaseModel] = [
    GameCreated(
        **EV,
        seq=1,
        prev_hash="",
        game="hexade",
        options={},
        seats=[SeatSpec(kind="bot", name="a"), SeatSpec(kind="bot", name="b")],
        move_time_ms=0,
        seed=1,
        engine_version="1",
    ),
    PlayerSeated(**EV, seq=2, prev_hash=H, seat=1, name="a", kind="bot", token_hash=H),
    GameStarted(**EV, seq=3, prev_hash=H, to_move=1, colours=[1, 2]),
    MovePlayed(
        **EV,
        seq=4,
        prev_hash=H,
        ply=1,
        seat=2,
        colour=2,
        move="swap",
        scores_after=None,
        colours=[2, 1],
        to_move=1,
    ),
    GameEnded(**EV, seq=5, prev_hash=H, result=0, scores=[3, 3], reason="natural", detail="x"),
    # every lean field away from its default
    GameCreated(
        **EV,
        seq=1,
        prev_hash="",
        game="teeko",
        options={},
        seats=[SeatSpec(kind="bot", name="a"), SeatSpec(kind="bot", name="b")],
        move_time_ms=100,
        seed=1,
        engine_version="1",
        imported_from="g0",
        time_bank_ms=500,
        on_timeout="random_move",
        forfeit_illegal=True,
        tournament="t1",
    ),
    GameEnded(
        **EV,
        seq=9,
        prev_hash=H,
        result=1,
        scores=None,
        reason="time_forfeit",
        fault=2,
        overrun_ms=75,
    ),
]


def test_lean_fields_are_encoded_only_away_from_their_default() -> None:
    # Logs written before these fields existed keep their bytes: an event that does not use
    # them encodes without them, and one that does carries every one.
    for model in EVENTS:
        stored = unpack(encode(model))
        for name in getattr(model, "LEAN", ()):
            at_default = getattr(model, name) == type(model).model_fields[name].default
            assert (name in stored) is not at_default, (type(model).__name__, name)


@pytest.mark.parametrize("model", COMMANDS, ids=lambda m: type(m).__name__)
def test_commands_round_trip(model: BaseModel) -> None:
    assert decode_command(encode(model)) == model


@pytest.mark.parametrize("model", EVENTS, ids=lambda m: type(m).__name__)
def test_events_round_trip_with_stable_bytes(model: BaseModel) -> None:
    data = encode(model)
    back = decode_event(data)
    assert back == model
    # The hash chain hashes stored bytes; re-encoding a decoded event must not change them.
    assert encode(back) == data


@pytest.mark.parametrize(
    "fields",
    [
        {
            "scores_after": None,
            "colours": [1, 2],
            "to_move": 2,
            "move": "C4",
            "ply": 0,
            "think_ms": 0,
            "timeout": False,
        },
        {
            "scores_after": [3, 11],
            "colours": [2, 1],
            "to_move": 0,
            "move": "swap",
            "ply": 41,
            "think_ms": 1234,
            "timeout": False,
        },
        {
            "scores_after": [0, 0],
            "colours": [1, 2],
            "to_move": 1,
            "move": "xé3",
            "ply": 7,
            "think_ms": 250,
            "timeout": True,
        },
    ],
)
def test_the_engines_fast_encoders_write_the_models_bytes(fields: dict[str, Any]) -> None:
    # The engine encodes MovePlayed and Accepted without models: the bytes must be the
    # very bytes `encode` gives, or hash chains and idempotent replies would differ.
    common = {
        "game_id": "g-1",
        "seq": 9,
        "time": 1_700_000_000_123,
        "command_id": "m-g-1-7",
        "prev_hash": H,
        "seat": 2,
        "colour": 1,
    }
    model = MovePlayed(**common, **fields)
    event = move_played_map(
        common["game_id"],
        common["seq"],
        common["time"],
        common["command_id"],
        common["prev_hash"],
        fields["ply"],
        common["seat"],
        common["colour"],
        fields["move"],
        fields["scores_after"],
        fields["colours"],
        fields["to_move"],
        fields["think_ms"],
        fields["timeout"],
    )
    fast = encode_map(event)
    assert fast == encode(model) and decode_event(fast) == model
    assert event == model.model_dump()  # the map is what hot readers fold
    for token in (None, "tok"):
        reply = Accepted(command_id="c", game_id="g-1", seq=9, token=token)
        assert encode_accepted("c", "g-1", 9, token) == encode(reply)


def test_replies_and_turns_round_trip() -> None:
    for reply in (
        Accepted(command_id="c", game_id="g", seq=3, token="tok"),
        Rejected(command_id="c", game_id="g", code="stale_seq", message="log is at 4", seq=4),
    ):
        assert decode_reply(encode(reply)) == reply
    turn = TurnRequest(
        game_id="g",
        game="teeko",
        options={"markers": "8"},
        moves=["C3", "B2"],
        seq=5,
        seat=1,
        colour=1,
        bot="random",
        token="t",
        deadline=10,
    )
    assert decode_turn(encode(turn)) == turn


def test_every_encoding_carries_type_and_version() -> None:
    for model in [*COMMANDS, *EVENTS]:
        raw = msgpack.unpackb(encode(model))
        assert raw["v"] == 1 and raw["type"] == model.model_dump()["type"]


def test_directions_are_closed_sets() -> None:
    # An event is not a command, a command is not a reply: each decoder knows only its own.
    with pytest.raises(DecodeError, match="does not match any of the expected tags"):
        decode_command(encode(EVENTS[0]))
    with pytest.raises(DecodeError):
        decode_event(encode(COMMANDS[0]))
    with pytest.raises(DecodeError):
        decode_reply(encode(COMMANDS[2]))


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (b"\xc1", "not msgpack"),
        (b"", "not msgpack"),
        (msgpack.packb([1, 2]), "expected a map"),
        (msgpack.packb({"type": "teleport", "v": 1}), "teleport"),
        (msgpack.packb({"v": 1}), "Unable to extract tag"),
        (msgpack.packb({1: 2}), "not msgpack"),
        (
            msgpack.packb({"type": "play_move", "v": 1, "command_id": "c"}),
            "game_id: Field required",
        ),
        (
            encode(COMMANDS[2])[:-1] + b"\xcc",  # truncated: expected_seq's value cut short
            "not msgpack",
        ),
    ],
)
def test_malformed_entries_raise_decode_error(data: bytes, fragment: str) -> None:
    with pytest.raises(DecodeError) as info:
        decode_command(data)
    assert info.value.code == "malformed"
    assert fragment in info.value.message


def test_wrong_version_and_extra_fields_are_malformed() -> None:
    raw = msgpack.unpackb(encode(COMMANDS[2]))
    for bad in ({**raw, "v": 2}, {**raw, "extra": 1}, {**raw, "expected_seq": "four"}):
        with pytest.raises(DecodeError) as info:
            decode_command(msgpack.packb(bad))
        assert info.value.code == "malformed"


def test_oversized_entries_are_refused_unread() -> None:
    big = msgpack.packb({"type": "play_move", "pad": "x" * MAX_ENTRY_BYTES})
    with pytest.raises(DecodeError) as info:
        decode_command(big)
    assert info.value.code == "too_large"
    # Exactly at the limit it is read (and then found malformed, not too large).
    at = msgpack.packb({"pad": "x" * (MAX_ENTRY_BYTES - 8)})
    assert len(at) == MAX_ENTRY_BYTES
    with pytest.raises(DecodeError) as info:
        decode_command(at)
    assert info.value.code == "malformed"


def test_reply_address_of_broken_commands() -> None:
    half = msgpack.packb({"type": "play_move", "command_id": "c9", "reply_to": "r"})
    assert reply_address(half) == ("c9", "r")
    assert reply_address(msgpack.packb({"reply_to": "r", "command_id": 5})) == ("", "r")
    assert reply_address(msgpack.packb({"command_id": "c9"})) is None
    assert reply_address(b"\xc1") is None
    assert reply_address(msgpack.packb(["r"])) is None


def test_ids_that_become_key_names_are_checked() -> None:
    for bad in ("", "a:b", "{1}", "a b", "x" * 65):
        with pytest.raises(ValidationError):
            ClaimTimeout(command_id="c", game_id=bad, expected_seq=0)
    with pytest.raises(ValidationError, match="bot name"):
        SeatSpec(kind="bot", name="evil}bot")
    with pytest.raises(ValidationError):
        CreateGame(command_id="c", game_id="g", game="teeko", seats=[SeatSpec(kind="human")])


def test_reject_codes_are_the_closed_set_of_the_issue() -> None:
    assert set(REJECT_CODES) == {
        "illegal_move",
        "invalid_move",
        "not_your_turn",
        "too_late",
        "stale_seq",
        "bad_token",
        "unknown_game",
        "game_over",
        "malformed",
        "too_large",
        "invalid_import",
        "reused_command_id",
    }
    with pytest.raises(ValidationError):
        Rejected(command_id="c", code="nope", message="")


def test_tokens() -> None:
    secret = b"s"
    t1, t2 = bot_token(secret, "g1", 1), bot_token(secret, "g1", 2)
    assert t1 != t2 and t1 == bot_token(secret, "g1", 1)
    assert t1 != bot_token(b"other", "g1", 1)
    assert token_matches(t1, token_hash(t1)) and not token_matches(t2, token_hash(t1))
    assert admin_token(secret) != admin_token(b"other")


@pytest.mark.parametrize("sent", ["é", "\udcff", "\ud800x", "日本"])
def test_any_text_a_client_sends_compares_as_a_wrong_token(sent: str) -> None:
    # hmac.compare_digest refuses non-ASCII str and str.encode() refuses lone surrogates
    known = bot_token(b"s", "g1", 1)
    assert not tokens_equal(sent, known) and not token_matches(sent, token_hash(known))
    assert tokens_equal(sent, sent) and token_matches(sent, token_hash(sent))


def test_event_hash_is_sha256_hex_of_the_bytes() -> None:
    assert event_hash(b"") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def test_json_schema_of_every_direction() -> None:
    out = schemas()
    assert set(out) == {"commands", "events", "replies", "turns"}
    text = json.dumps(out)
    for name in ("CreateGame", "MovePlayed", "Rejected", "TurnRequest", "PlayerSeated"):
        assert name in text
    tags = {
        m["properties"]["type"]["const"]
        for m in out["commands"]["$defs"].values()
        if "type" in m.get("properties", {})
    }
    assert tags == {
        "create_game",
        "seat_player",
        "play_move",
        "resign",
        "claim_timeout",
        "abort",
        "import_game",
    }


def test_agon_schemas_writes_one_file_per_direction(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    schemas_cmd.add_arguments(parser)
    assert schemas_cmd.run(parser.parse_args(["--out", str(tmp_path)])) == 0
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == [f"{d}.schema.json" for d in ("commands", "events", "replies", "turns")]
    events = json.loads((tmp_path / "events.schema.json").read_text())
    assert set(events["$defs"]) >= {"GameCreated", "MovePlayed", "GameEnded"}


def test_the_event_map_types_name_exactly_the_models_fields() -> None:
    # Hot readers read events through these TypedDicts: a field added to a model and not
    # to its map (or the other way round) would go unchecked by mypy.
    from schemas.events import EVENT_MAPS, SeatSpecMap

    for model, mapping in EVENT_MAPS.items():
        keys = mapping.__required_keys__ | mapping.__optional_keys__
        assert set(keys) == set(model.model_fields), model
        # Only a field left out of the encoding at its default (and `think_ms`, which logs
        # written before it lack) may be optional in the map.
        lean = set(getattr(model, "LEAN", ()))
        if model is MovePlayed:
            lean.add("think_ms")
        assert mapping.__optional_keys__ == lean, model
    assert set(SeatSpecMap.__required_keys__) == set(SeatSpec.model_fields)
