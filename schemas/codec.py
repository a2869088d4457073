"""The one codec: pydantic models <-> msgpack bytes, one decoder per direction.

A stream entry carries one encoded model in field `m` (`FIELD`). `encode` writes the
model's fields (including `type` and the schema version `v`) as a msgpack map in
declaration order, so the same model always gives the same bytes; the hash chain
hashes those stored bytes (`event_hash`). `move_played_map` with `encode_map`, and
`encode_accepted`, write the same bytes as `encode` from plain values without building a
model, for the engine's hot path, where every value comes from data it has checked. Decoders
never raise anything but `DecodeError`, whose `code` is "malformed" or "too_large",
the reply codes a sender gets for a broken entry.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, Literal, TypeVar, cast

import msgpack
from pydantic import BaseModel, TypeAdapter, ValidationError

from schemas.base import SCHEMA_VERSION
from schemas.commands import Command
from schemas.events import Event, EventMap, MovePlayedMap
from schemas.replies import Reply
from schemas.turns import Turn

#: The stream-entry field that holds the encoded model.
FIELD = "m"
FIELD_BYTES = FIELD.encode()
#: Entries larger than this are refused unread...
MAX_ENTRY_BYTES = 64 * 1024
#: ...but for an `import_game` command, which carries a whole game's log: it may be this
#: large (about 5000 events). Its events are each within `MAX_ENTRY_BYTES` again.
MAX_IMPORT_BYTES = 1024 * 1024

T = TypeVar("T")

_COMMANDS: TypeAdapter[Command] = TypeAdapter(Command)
_EVENTS: TypeAdapter[Event] = TypeAdapter(Event)
_REPLIES: TypeAdapter[Reply] = TypeAdapter(Reply)
_TURNS: TypeAdapter[Turn] = TypeAdapter(Turn)


class DecodeError(ValueError):
    """An entry that is not a valid model; `code` is "malformed" or "too_large"."""

    def __init__(self, code: Literal["malformed", "too_large"], message: str) -> None:
        super().__init__(message)
        self.code: Literal["malformed", "too_large"] = code
        self.message = message


def encode(model: BaseModel) -> bytes:
    return msgpack.packb(model.model_dump(mode="python"), use_bin_type=True)


def move_played_map(
    game_id: str,
    seq: int,
    time: int,
    command_id: str,
    prev_hash: str,
    ply: int,
    seat: int,
    colour: int,
    move: str,
    scores_after: list[int] | None,
    colours: list[int],
    to_move: int,
    think_ms: int,
    timeout: bool = False,
    lag_ms: int = 0,
) -> MovePlayedMap:
    """The map of a `MovePlayed` of trusted values, without building (and validating) the
    model: the engine's hottest event. Field by field in `MovePlayed`'s declaration order,
    so `encode_map` writes the bytes `encode(MovePlayed(...))` would (tests hold it so)."""
    event: MovePlayedMap = {
        "v": SCHEMA_VERSION,
        "game_id": game_id,
        "seq": seq,
        "time": time,
        "command_id": command_id,
        "prev_hash": prev_hash,
        "type": "move_played",
        "ply": ply,
        "seat": seat,
        "colour": colour,
        "move": move,
        "scores_after": scores_after,
        "colours": colours,
        "to_move": to_move,
        "think_ms": think_ms,
    }
    if timeout:
        event["timeout"] = True
    if lag_ms:
        event["lag_ms"] = lag_ms
    return event


def encode_map(event: EventMap) -> bytes:
    """An event map (in its model's field order) as the bytes `encode` gives its model."""
    data: bytes = msgpack.packb(event, use_bin_type=True)
    return data


def encode_accepted(command_id: str, game_id: str, seq: int, token: str | None) -> bytes:
    """`encode(Accepted(...))` of trusted values, field by field in declaration order."""
    data: bytes = msgpack.packb(
        {
            "v": SCHEMA_VERSION,
            "type": "accepted",
            "command_id": command_id,
            "game_id": game_id,
            "seq": seq,
            "token": token,
        },
        use_bin_type=True,
    )
    return data


def event_hash(data: bytes) -> str:
    """The chain link: sha256 hex of an event's stored bytes (the next event's prev_hash)."""
    return hashlib.sha256(data).hexdigest()


def unpack(data: bytes, limit: int = MAX_ENTRY_BYTES) -> dict[str, Any]:
    """The raw msgpack map of an entry, checked for size (at most `limit` bytes) and shape."""
    if len(data) > limit:
        raise DecodeError("too_large", f"entry of {len(data)} bytes exceeds {limit}")
    try:
        obj = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise DecodeError("malformed", f"not msgpack ({type(exc).__name__}: {exc})") from None
    if not isinstance(obj, dict):
        raise DecodeError("malformed", f"expected a map, got {type(obj).__name__}")
    return obj


#: An event's stored map, checked for size and shape only: for readers of events the engine
#: validated on their way into the log (see `schemas.events.EventMap`). `unpack` itself,
#: typed for them: no call in between on the hottest loop of a rebuild.
unpack_event = cast("Callable[[bytes], EventMap]", unpack)


def _decode(adapter: TypeAdapter[T], data: bytes, what: str) -> T:
    obj = unpack(data)
    return _validate(adapter, obj, what)


def _validate(adapter: TypeAdapter[T], obj: dict[str, Any], what: str) -> T:
    try:
        return adapter.validate_python(obj)
    except ValidationError as exc:
        raise DecodeError("malformed", f"bad {what}: {_summary(exc)}") from None


def _summary(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err["loc"]) or "entry"
        parts.append(f"{where}: {err['msg']}")
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f" (+{more} more)" if more > 0 else "")


def decode_command(data: bytes) -> Command:
    """A command; only an `import_game` may exceed `MAX_ENTRY_BYTES` (up to
    `MAX_IMPORT_BYTES`)."""
    if len(data) <= MAX_ENTRY_BYTES:
        return _decode(_COMMANDS, data, "command")
    obj = unpack(data, MAX_IMPORT_BYTES)
    if obj.get("type") != "import_game":
        raise DecodeError("too_large", f"entry of {len(data)} bytes exceeds {MAX_ENTRY_BYTES}")
    return _validate(_COMMANDS, obj, "command")


def decode_event(data: bytes) -> Event:
    return _decode(_EVENTS, data, "event")


def decode_reply(data: bytes) -> Reply:
    return _decode(_REPLIES, data, "reply")


def decode_turn(data: bytes) -> Turn:
    return _decode(_TURNS, data, "turn request")


def reply_address(data: bytes) -> tuple[str, str] | None:
    """`(command_id, reply_to)` of an entry that failed to decode, if they can be read.

    Lets the engine answer a malformed command; None sends it to the dead-letter stream.
    """
    try:
        obj = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception:
        return None
    if not isinstance(obj, dict):
        return None
    command_id, reply_to = obj.get("command_id"), obj.get("reply_to")
    if not isinstance(reply_to, str) or not reply_to or len(reply_to) > 256:
        return None
    if not isinstance(command_id, str) or len(command_id) > 128:
        command_id = ""
    return command_id, reply_to


def schemas() -> dict[str, dict[str, Any]]:
    """JSON Schema of every direction's closed set, keyed by direction."""
    return {
        "commands": _COMMANDS.json_schema(),
        "events": _EVENTS.json_schema(),
        "replies": _REPLIES.json_schema(),
        "turns": _TURNS.json_schema(),
    }
