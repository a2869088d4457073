"""The dependency direction of DESIGN.md, read from the source with `ast` (nothing is imported).

`engine` <- `schemas` <- `services.bus` <- the services and `bots` <- the CLI (`services.cli`,
which no service imports); `bots.sdk` talks to the arena without `services`; the engine
service, dispatcher and gateway read games through `services.gamelog`, never the projector;
nothing but the tests imports `tests`; no two modules import each other, directly or
through others; and the gateway reaches Redis only through the bus clients, the bot registry
and the tournament store (`GATEWAY_REDIS` names the raw uses left, and why). Every import
statement counts wherever it stands (inside a function, under `if TYPE_CHECKING:`), and so
does `importlib.import_module("x")` with a literal name.

An edge goes to the module an import names: `import a.b.c` is an edge to `a.b.c` only (not to
its parents); `from a.b import c` is an edge to `a.b.c` when that is a module, else to `a.b`
(whose `__init__` defines `c`); relative imports resolve against the importing module's
package. So a package `__init__` that imports its submodules, and a submodule that imports
names from that `__init__`, make a cycle, as they do when Python runs them.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.source import parse

ROOT = Path(__file__).resolve().parents[2]
FIRST_PARTY = ("engine", "schemas", "services", "bots", "bench", "tests")


@dataclass(frozen=True)
class Source:
    """One module: its dotted name, its file (relative to the project) and its text."""

    name: str
    path: str
    text: str

    @property
    def is_package(self) -> bool:
        return self.path.endswith("__init__.py")


@dataclass(frozen=True)
class Import:
    """One import of `target` (a dotted module name) by `importer`, where it stands."""

    importer: str
    path: str
    line: int
    statement: str
    target: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: `{self.statement}` (-> {self.target})"


def module_name(relative: Path) -> str:
    parts = list(relative.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_sources(root: Path = ROOT) -> dict[str, Source]:
    """Every .py file of the first-party packages under `root`, by module name."""
    sources: dict[str, Source] = {}
    for package in FIRST_PARTY:
        base = root / package
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*.py")):
            relative = path.relative_to(root)
            if any(part.startswith(".") or part == "__pycache__" for part in relative.parts):
                continue
            name = module_name(relative)
            sources[name] = Source(name, relative.as_posix(), path.read_text(encoding="utf-8"))
    return sources


def top(name: str) -> str:
    return name.split(".", 1)[0]


def within(name: str, package: str) -> bool:
    """Whether module `name` is `package` or one of its submodules."""
    return name == package or name.startswith(package + ".")


def _resolve_from(source: Source, node: ast.ImportFrom) -> str:
    """The module a `from ... import` reads from, with relative levels resolved."""
    if not node.level:
        return node.module or ""
    package = source.name if source.is_package else source.name.rpartition(".")[0]
    parts = package.split(".") if package else []
    if node.level - 1 > len(parts):
        return node.module or ""  # beyond the top: Python refuses it; keep what it names
    base = parts[: len(parts) - (node.level - 1)]
    if node.module:
        base.append(node.module)
    return ".".join(base)


def _dynamic_target(node: ast.Call) -> str | None:
    """`importlib.import_module("x")`, `import_module("x")` or `__import__("x")`: "x"."""
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if called not in ("import_module", "__import__") or not node.args:
        return None
    first = node.args[0]
    if isinstance(first, ast.Constant) and isinstance(first.value, str):
        return first.value
    return None


def _text(source: Source, node: ast.AST) -> str:
    """The statement as written, on one line."""
    return " ".join((ast.get_source_segment(source.text, node) or "").split())


def imports_of(source: Source, modules: Iterable[str]) -> Iterator[Import]:
    """Every import in one module's text, resolved to the module it reaches."""
    known = set(modules)
    tree = parse(source.text, filename=source.path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            statement = _text(source, node)
            for alias in node.names:
                yield Import(source.name, source.path, node.lineno, statement, alias.name)
        elif isinstance(node, ast.ImportFrom):
            statement = _text(source, node)
            base = _resolve_from(source, node)
            targets = []
            for alias in node.names:
                sub = f"{base}.{alias.name}" if base else alias.name
                targets.append(sub if alias.name != "*" and sub in known else base)
            for target in dict.fromkeys(targets):  # each target once, in order
                if target:
                    yield Import(source.name, source.path, node.lineno, statement, target)
        elif isinstance(node, ast.Call):
            target = _dynamic_target(node)
            if target:
                yield Import(source.name, source.path, node.lineno, _text(source, node), target)


def first_party_imports(sources: Mapping[str, Source]) -> list[Import]:
    found = []
    for source in sources.values():
        found.extend(i for i in imports_of(source, sources) if top(i.target) in FIRST_PARTY)
    return found


SOURCES = project_sources()
IMPORTS = first_party_imports(SOURCES)


def _offending(rule: str, bad: list[Import]) -> str:
    lines = "\n  ".join(str(i) for i in bad)
    return f"{rule}; {len(bad)} offending import(s):\n  {lines}"


# -- the layer rules --------------------------------------------------------------------------

#: The services that read games only through their log: they must not load the projector.
PROJECTOR_FREE = ("services.engine_service", "services.dispatcher", "services.gateway")

#: rule id -> (what it says, which importers it binds, which targets it allows)
LAYERS = {
    "engine-imports-no-other-first-party-package": (
        "engine imports no other first-party package",
        lambda importer: within(importer, "engine"),
        lambda target: within(target, "engine"),
    ),
    "schemas-imports-only-engine": (
        "schemas imports only engine and schemas",
        lambda importer: within(importer, "schemas"),
        lambda target: top(target) in ("engine", "schemas"),
    ),
    "services-bus-imports-only-schemas-and-engine": (
        "services.bus imports only schemas, engine and services.bus",
        lambda importer: within(importer, "services.bus"),
        lambda target: top(target) in ("engine", "schemas") or within(target, "services.bus"),
    ),
    "bots-import-only-the-bus-of-services": (
        "bots import nothing of services but services.bus",
        lambda importer: within(importer, "bots"),
        lambda target: top(target) != "services" or within(target, "services.bus"),
    ),
    "bots-sdk-imports-only-engine-and-schemas": (
        "bots.sdk imports only engine, schemas and bots.sdk (no services at all)",
        lambda importer: within(importer, "bots.sdk"),
        lambda target: top(target) in ("engine", "schemas") or within(target, "bots.sdk"),
    ),
    "only-tests-import-tests": (
        "nothing outside tests imports tests",
        lambda importer: not within(importer, "tests"),
        lambda target: not within(target, "tests"),
    ),
    "engine-dispatcher-gateway-import-no-projector": (
        "services.engine_service, services.dispatcher and services.gateway do not import"
        " services.projector (the game log they read is services.gamelog; the CLI and the"
        " archive may)",
        lambda importer: any(within(importer, p) for p in PROJECTOR_FREE),
        lambda target: not within(target, "services.projector"),
    ),
    "no-service-imports-the-cli": (
        "no service package imports services.cli (the CLI runs the services; bench and tests"
        " may import it)",
        lambda importer: within(importer, "services") and not within(importer, "services.cli"),
        lambda target: not within(target, "services.cli"),
    ),
}


def layer_violations(rule: str, imports: Iterable[Import]) -> list[Import]:
    _, binds, allows = LAYERS[rule]
    return [i for i in imports if binds(i.importer) and not allows(i.target)]


@pytest.mark.parametrize("rule", list(LAYERS))
def test_layer(rule: str) -> None:
    bad = layer_violations(rule, IMPORTS)
    if bad:
        pytest.fail(_offending(LAYERS[rule][0], bad), pytrace=False)


# -- the gateway reaches Redis through the clients ----------------------------------------------

#: What the gateway may do with the raw connection (`app[appkeys.REDIS]`, `redis`, `<x>.redis`),
#: module by module, and why. Everything else goes through the bus clients, the bot registry
#: and the tournament store, built once in `services.gateway.app` and kept in app keys.
#: An exception no longer used fails the test too: the list only shrinks.
GATEWAY_REDIS = {
    "reads the connection": {
        "services.gateway.games": "hands it to `services.bus.quotas.take`, a script of the bus",
    },
    "sends a command on it": {
        "services.gateway.app": "closes the connection it opened",
    },
}


@dataclass(frozen=True)
class RedisUse:
    """One use of a raw Redis connection by `module`: `kind` is a key of `GATEWAY_REDIS`."""

    module: str
    path: str
    line: int
    kind: str
    text: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.kind}: `{self.text}`"


def _is_redis_key(node: ast.expr) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "REDIS") or (
        isinstance(node, ast.Name) and node.id == "REDIS"
    )


def _is_connection(node: ast.expr) -> bool:
    """`redis`, `<x>.redis` or `<x>[appkeys.REDIS]`: the raw connection, not a client."""
    if isinstance(node, ast.Name):
        return node.id == "redis"
    if isinstance(node, ast.Attribute):
        return node.attr == "redis"
    return isinstance(node, ast.Subscript) and _is_redis_key(node.slice)


def redis_uses(source: Source) -> Iterator[RedisUse]:
    """Where `source` reads the connection out of the app, or calls a method on it."""
    for node in ast.walk(parse(source.text)):
        kind = None
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            kind = "reads the connection" if _is_redis_key(node.slice) else None
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            kind = "sends a command on it" if _is_connection(node.func.value) else None
        if kind is not None:
            yield RedisUse(source.name, source.path, node.lineno, kind, _text(source, node))


def gateway_redis_uses(sources: Mapping[str, Source]) -> list[RedisUse]:
    return [
        use
        for name, source in sorted(sources.items())
        if within(name, "services.gateway")
        for use in redis_uses(source)
    ]


def test_the_gateway_reaches_redis_only_through_the_clients_and_the_store() -> None:
    uses = gateway_redis_uses(SOURCES)
    bad = [u for u in uses if u.module not in GATEWAY_REDIS[u.kind]]
    if bad:
        lines = "\n  ".join(map(str, bad))
        pytest.fail(
            "services.gateway reaches Redis only through the bus clients, the bot registry and"
            f" the tournament store (app keys); {len(bad)} raw use(s):\n  {lines}",
            pytrace=False,
        )
    used = {(u.kind, u.module) for u in uses}
    stale = [(k, m) for k, allowed in GATEWAY_REDIS.items() for m in allowed if (k, m) not in used]
    assert not stale, f"exceptions no longer needed, drop them from GATEWAY_REDIS: {stale}"


def test_the_gateway_redis_check_sees_a_handler_reaching_past_the_clients() -> None:
    sources, _, _ = _synthetic(
        {
            "services/gateway/pages.py": (
                "async def catalogue(request):\n"
                "    async for raw, _ in request.app[appkeys.REDIS].hscan_iter(key):\n"
                "        pass\n"
                "    await request.app[appkeys.QUERY].redis.xlen(key)\n"
            ),
            "services/gateway/turns.py": (
                "async def pending(self):\n"
                "    redis = self.app[appkeys.REDIS]\n"
                "    return await redis.xrevrange(self.inbox, count=200)\n"
            ),
            "services/gateway/tournaments.py": (
                "async def get(request):\n"
                "    request.app[appkeys.REDIS_CONNECTIONS]\n"
                "    await request.app[appkeys.TOURNAMENTS].load(request.match_info['id'])\n"
                "    await request.app[appkeys.QUERY].heads([request.match_info['id']])\n"
            ),
            "services/bus/clients.py": "async def head(self, g):\n    await self.redis.xlen(g)\n",
        }
    )
    assert sorted((u.module, u.line, u.kind) for u in gateway_redis_uses(sources)) == [
        ("services.gateway.pages", 2, "reads the connection"),
        ("services.gateway.pages", 2, "sends a command on it"),
        ("services.gateway.pages", 4, "sends a command on it"),
        ("services.gateway.turns", 2, "reads the connection"),
        ("services.gateway.turns", 3, "sends a command on it"),
    ]


# -- cycles --------------------------------------------------------------------------------------

Graph = dict[str, dict[str, list[Import]]]


def module_graph(imports: Iterable[Import], modules: Iterable[str]) -> Graph:
    """importer -> imported module -> the imports making that edge, between known modules.

    A module importing itself (a package `__init__` reading its own names) is no edge.
    """
    known = set(modules)
    graph: Graph = {m: {} for m in sorted(known)}
    for i in imports:
        if i.target in known and i.target != i.importer:
            graph[i.importer].setdefault(i.target, []).append(i)
    return graph


def find_cycles(graph: Graph) -> list[list[str]]:
    """One cycle (first node repeated at the end) per strongly connected part, or none.

    Tarjan's algorithm, iterative, in sorted order so the report is stable.
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    parts: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            advanced = False
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, {})))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                part = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    part.append(member)
                    if member == node:
                        break
                if len(part) > 1:
                    parts.append(sorted(part))
    return [_cycle_within(graph, set(part), part[0]) for part in parts]


def _cycle_within(graph: Graph, part: set[str], start: str) -> list[str]:
    """A shortest cycle through `start` inside one strongly connected part (breadth-first)."""
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph.get(node, {})):
                if nxt not in part:
                    continue
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if nxt not in came_from:
                    came_from[nxt] = node
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no cycle through {start} in {sorted(part)}")  # pragma: no cover


def describe_cycle(graph: Graph, cycle: list[str]) -> str:
    steps = []
    for a, b in itertools.pairwise(cycle):
        steps.append(f"    {a} -> {b}: {graph[a][b][0]}")
    return " -> ".join(cycle) + "\n" + "\n".join(steps)


def restrict(graph: Graph, keep: Iterable[str]) -> Graph:
    nodes = set(keep)
    return {
        m: {t: e for t, e in out.items() if t in nodes} for m, out in graph.items() if m in nodes
    }


GRAPH = module_graph(IMPORTS, SOURCES)

#: the whole project, and each package on its own (so a clean one shows as passing)
CYCLE_SCOPES = ["all", *FIRST_PARTY]


@pytest.mark.parametrize("scope", CYCLE_SCOPES)
def test_no_import_cycle_between_modules(scope: str) -> None:
    graph = GRAPH if scope == "all" else restrict(GRAPH, (m for m in GRAPH if top(m) == scope))
    cycles = find_cycles(graph)
    if cycles:
        report = "\n".join(describe_cycle(graph, c) for c in cycles)
        pytest.fail(
            f"{len(cycles)} import cycle(s) among {scope} modules:\n{report}", pytrace=False
        )


def package_of(module: str) -> str:
    """The layer a module belongs to: its top-level package, but `services.bus` on its own."""
    return "services.bus" if within(module, "services.bus") else top(module)


def package_graph(imports: Iterable[Import]) -> Graph:
    graph: Graph = {}
    for i in imports:
        a, b = package_of(i.importer), package_of(i.target)
        graph.setdefault(a, {})
        graph.setdefault(b, {})
        if a != b:
            graph[a].setdefault(b, []).append(i)
    return graph


def test_no_import_cycle_between_packages() -> None:
    """engine, schemas, services.bus, the other services, bots, bench, tests: a partial order.

    `services` may import `bots` (to run them) as long as `bots` imports only `services.bus`.
    """
    graph = package_graph(IMPORTS)
    cycles = find_cycles(graph)
    if cycles:
        report = "\n".join(describe_cycle(graph, c) for c in cycles)
        pytest.fail(f"{len(cycles)} import cycle(s) between packages:\n{report}", pytrace=False)


# -- the checker checks what it should ----------------------------------------------------------


def _synthetic(files: Mapping[str, str]) -> tuple[dict[str, Source], list[Import], Graph]:
    sources = {
        module_name(Path(path)): Source(module_name(Path(path)), path, text)
        for path, text in files.items()
    }
    imports = first_party_imports(sources)
    return sources, imports, module_graph(imports, sources)


def test_a_package_init_and_its_submodule_importing_it_back_is_a_cycle() -> None:
    """The old engine.core <-> engine.games case, and a submodule reading its `__init__`."""
    _, _, graph = _synthetic(
        {
            "engine/__init__.py": "from engine.core import load_game\n",
            "engine/core.py": "def load_game():\n    import engine.games\n",
            "engine/games/__init__.py": "from . import teeko\n",
            "engine/games/teeko.py": "from engine.core import load_game\n",
        }
    )
    assert find_cycles(graph) == [
        ["engine.core", "engine.games", "engine.games.teeko", "engine.core"]
    ]
    _, _, graph = _synthetic(
        {
            "engine/games/__init__.py": "from . import teeko\nHELPER = 1\n",
            "engine/games/teeko.py": "from engine.games import HELPER\n",
            "engine/games/hexade.py": "from engine.games.teeko import x\nfrom .. import games\n",
        }
    )
    assert find_cycles(graph) == [["engine.games", "engine.games.teeko", "engine.games"]]


def test_the_checker_resolves_relative_and_submodule_imports() -> None:
    _, imports, _ = _synthetic(
        {
            "services/bus/__init__.py": "from .keys import K\nfrom . import scripts\n",
            "services/bus/keys.py": "K = 1\n",
            "services/bus/scripts.py": "from ..projector import x\n",
            "services/projector.py": "import importlib\nimportlib.import_module('bots.worker')\n",
            "bots/worker.py": "from services.bus import keys\nfrom services import projector\n",
        }
    )
    assert sorted((i.importer, i.target) for i in imports) == [
        ("bots.worker", "services.bus.keys"),
        ("bots.worker", "services.projector"),
        ("services.bus", "services.bus.keys"),
        ("services.bus", "services.bus.scripts"),
        ("services.bus.scripts", "services.projector"),
        ("services.projector", "bots.worker"),
    ]
    bus_rule = layer_violations("services-bus-imports-only-schemas-and-engine", imports)
    assert [(i.importer, i.target) for i in bus_rule] == [
        ("services.bus.scripts", "services.projector")
    ]
    bots_rule = layer_violations("bots-import-only-the-bus-of-services", imports)
    assert [(i.importer, i.target) for i in bots_rule] == [("bots.worker", "services.projector")]
    assert find_cycles(package_graph(imports)) == [["bots", "services", "bots"]]


def test_the_cli_rule_binds_the_services_but_not_the_cli_bench_or_tests() -> None:
    _, imports, _ = _synthetic(
        {
            "services/bus/embedded.py": "from services.cli.options import non_negative_float\n",
            "services/gateway/app.py": "def f():\n    from services import cli\n",
            "services/cli/__init__.py": "from services.cli.main import main\n",
            "services/cli/up.py": "from services.cli.common import with_redis\n",
            "bench/load.py": "from services.cli.options import UsageError\n",
            "tests/test_x.py": "from services.cli.pipeline import ServiceSet\n",
        }
    )
    bad = layer_violations("no-service-imports-the-cli", imports)
    assert sorted((i.importer, i.target) for i in bad) == [
        ("services.bus.embedded", "services.cli.options"),
        ("services.gateway.app", "services.cli"),
    ]
