"""The archive: finished games moved out of Redis into compressed JSONL files, and back.

`files` holds an archive directory's files and its index (`Archive`, `Entry`); `move` moves
games from Redis into it (`archive`) and back (`restore`), with the scripts that delete and
rewrite them in Redis.
"""

from services.archive.files import (
    ARCHIVE_ENV,
    ARCHIVED,
    Archive,
    ArchiveError,
    Entry,
    open_archive,
    parse_age,
    valid_game_id,
)
from services.archive.move import (
    ArchiveStats,
    OnProgress,
    RestoreStats,
    archive,
    candidates,
    restore,
)

__all__ = [
    "ARCHIVED",
    "ARCHIVE_ENV",
    "Archive",
    "ArchiveError",
    "ArchiveStats",
    "Entry",
    "OnProgress",
    "RestoreStats",
    "archive",
    "candidates",
    "open_archive",
    "parse_age",
    "restore",
    "valid_game_id",
]
