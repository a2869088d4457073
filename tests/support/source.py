"""Parsing the project's own source in tests."""

from __future__ import annotations

import ast
import gc


def parse(text: str, filename: str = "<unknown>") -> ast.Module:
    """`ast.parse` with the cyclic collector paused. A collection inside it may run a
    finalizer that formats a traceback, which parses source too, and the nested parse
    breaks the outer one on CPython 3.11 ("AST constructor recursion depth mismatch")."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(text, filename=filename)
    finally:
        if enabled:
            gc.enable()
