"""`agon bots`: run the built-in bots' workers, or manage outside bots' keys.

    agon bots [--bot NAME]...              serve turn requests (as before)
    agon bots revoke NAME                  delete every key of the outside bot NAME

Revoking needs Redis access only (the operator's user): the bot's key hashes are deleted,
so every gateway refuses the key within its key cache (`services.gateway.bots.KEY_CACHE_S`,
5 s) and ends the streams it opened; the name stays registered, with its games and results.
The bot itself rotates its key through the gateway (`POST /api/bots/{name}/key`).
"""

from __future__ import annotations

import argparse
import asyncio

from services.bus.connection import Client
from services.bus.keys import Keys
from services.bus.registry import BotRegistry
from services.cli.common import with_redis
from services.cli.options import UsageError
from services.cli.services import BOTS

ACTIONS = ("revoke",)


class _Bots:
    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        BOTS.add_arguments(parser)
        parser.add_argument(
            "action", nargs="?", choices=ACTIONS, help="revoke: delete an outside bot's keys"
        )
        parser.add_argument("name", nargs="?", help="the outside bot (with revoke)")

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        if args.action is None:
            return BOTS.run(args)
        if not args.name:
            raise UsageError(f"{args.action} needs the bot's name: agon bots {args.action} NAME")

        async def body(redis: Client, keys: Keys, url: str, stop: asyncio.Event) -> int:
            bots = BotRegistry(redis, keys)
            if await bots.record(args.name) is None:
                raise UsageError(f"no outside bot is registered as {args.name!r}")
            revoked = await bots.revoke(args.name)
            print(f"agon bots: revoked {revoked} key{'s' * (revoked != 1)} of {args.name}")
            return 0

        return with_redis(args, body, embedded=False)


BOTS_COMMAND = _Bots()
