"""`agon-bot` (or `python -m bots.sdk`): run a bot function against an Agon gateway.

    agon-bot --url URL [--key KEY] [--register NAME [--accept-challenges]] [-v] module:function

`--key` defaults to $AGON_BOT_KEY and `--url` to $AGON_URL. `--register NAME` registers the
bot first and prints its key (shown only once); without `module:function` it only registers.
A `prepare(game, options)` function in the bot's module is its warm-up hook (`run_bot`'s
`prepare`). The bot runs until Ctrl-C or SIGTERM (exit 0). A bad `module:function` or a
missing key is one error line and exit 2; a refused key or name is one error line and exit 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import cast

import aiohttp

from bots.sdk.client import BotError, Choose, Prepare, register_bot, run_bot

PROG = "agon-bot"


class UsageError(Exception):
    """A command line that cannot run: exit 2."""


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
    )
    try:
        choose = _plan(args)
        if args.register:
            args.key = asyncio.run(_register(args.url, args.register, args.accept_challenges))
        if choose is None:
            return 0
        asyncio.run(_serve(args.url, args.key, choose))
    except UsageError as exc:
        return _fail(str(exc), 2)
    except BotError as exc:
        return _fail(str(exc), 1)
    except KeyboardInterrupt:
        pass
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Run a bot against an Agon gateway.")
    parser.add_argument("bot", nargs="?", help="the bot's choose function, as module:function")
    parser.add_argument("--url", default=os.environ.get("AGON_URL"), help="the gateway's URL")
    parser.add_argument("--key", default=os.environ.get("AGON_BOT_KEY"), help="the bot's key")
    parser.add_argument("--register", metavar="NAME", help="register a bot first; print its key")
    parser.add_argument(
        "--accept-challenges",
        action="store_true",
        help="with --register: anyone may seat the bot in a game (else only with its key)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return parser


def _plan(args: argparse.Namespace) -> Choose | None:
    """Check the command line before any network; the bot's function, or None to only register."""
    if not args.url:
        raise UsageError("no gateway URL: pass --url or set AGON_URL")
    if not args.bot and not args.register:
        raise UsageError("name the bot's function as module:function")
    choose = load_choose(args.bot) if args.bot else None
    if choose is not None and not args.register and not args.key:
        raise UsageError("no bot key: pass --key or set AGON_BOT_KEY (or --register NAME)")
    return choose


def load_choose(target: str) -> Choose:
    """Import `module:function` (the current directory is importable); `UsageError` if not."""
    module_name, _, name = target.partition(":")
    if not module_name or not name:
        raise UsageError(f"{target!r} is not module:function")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise UsageError(f"cannot import {module_name}: {type(exc).__name__}: {exc}") from None
    choose = getattr(module, name, None)
    if not callable(choose):
        raise UsageError(f"{module_name} has no function {name!r}")
    return cast(Choose, choose)


async def _register(url: str, name: str, accept_challenges: bool) -> str:
    try:
        key = await register_bot(url, name, accept_challenges=accept_challenges)
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise BotError(f"cannot reach {url}: {type(exc).__name__}: {exc}") from None
    print(f"registered bot {name}; its key (shown once, keep it): {key}", flush=True)
    return key


async def _serve(url: str, key: str, choose: Choose) -> None:
    """Run the bot until SIGINT or SIGTERM (when this thread may handle signals)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
    await run_bot(
        url,
        key,
        choose,
        stop=stop,
        on_connect=lambda: print(f"bot connected to {url}", flush=True),
        prepare=_prepare_beside(choose),
    )


def _prepare_beside(choose: Choose) -> Prepare | None:
    """The `prepare(game, options)` function of choose's module, if it has one."""
    prepare = getattr(sys.modules.get(getattr(choose, "__module__", "")), "prepare", None)
    return cast(Prepare, prepare) if callable(prepare) else None


def _fail(message: str, code: int) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
