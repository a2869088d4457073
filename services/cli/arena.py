"""The running arena: where `agon up` (`make run`) says which Redis it serves, for the others.

`agon up` writes a small JSON file (`record`) with its Redis URL, its gateway's URL and its
pid once it is ready, and removes it when it stops (`forget`); `agon status`, `agon
tournament run`, `agon replay` and every other command that takes `--redis-url` use that
Redis when neither `--redis-url` nor `$REDIS_URL` names one (`recorded_url`), so that with
`make run` going they work from another terminal with no flags. The file is
`$AGON_ARENA_FILE`, else `arena.json` under `$XDG_RUNTIME_DIR/agon` (or
`~/.local/state/agon`). A file whose process is gone is stale and ignored; a second
`agon up` while one is recorded leaves the record alone.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

#: The environment variable naming the arena file (the tests point it at a temporary one).
ARENA_ENV = "AGON_ARENA_FILE"


def arena_file() -> Path:
    explicit = os.environ.get(ARENA_ENV)
    if explicit:
        return Path(explicit)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) if runtime else Path.home() / ".local" / "state"
    return base / "agon" / "arena.json"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def recorded() -> dict[str, Any] | None:
    """The arena recorded by an `agon up` still running, or None."""
    try:
        data = json.loads(arena_file().read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("redis_url"), str):
        return None
    pid = data.get("pid")
    if not isinstance(pid, int) or not _alive(pid):
        return None
    return data


def recorded_url() -> str | None:
    """The Redis URL of the running arena, if one is recorded."""
    arena = recorded()
    return None if arena is None else str(arena["redis_url"])


def record(redis_url: str, site: str) -> Path | None:
    """Record this process as the running arena; None (nothing written) if another is."""
    other = recorded()
    if other is not None and other.get("pid") != os.getpid():
        return None
    path = arena_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps({"redis_url": redis_url, "url": site, "pid": os.getpid()}))
        temporary.replace(path)
    except OSError:
        return None
    return path


def forget() -> None:
    """Remove the record if it is this process's."""
    try:
        data = json.loads(arena_file().read_text())
    except (OSError, ValueError):
        return
    if isinstance(data, dict) and data.get("pid") == os.getpid():
        with contextlib.suppress(OSError):
            arena_file().unlink()
