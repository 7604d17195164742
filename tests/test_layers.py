"""The package layout's rules (docs/architecture.md § Layers), read from the imports of proxy/:
layers only point down, no import cycle between packages, and the request path shared by every
protocol names none of them. (Imports under TYPE_CHECKING are for annotations only: not counted.)"""

from __future__ import annotations

import ast
import collections
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROXY = ROOT / "proxy"
NEUTRAL = ("proxy.compaction", "proxy.toolresults", "proxy.recall", "proxy.store", "proxy.ops")
# the core: every module directly in proxy/ but the application's (the command, the app, the
# process state and what starts or drives a process), which sit on top of everything
APPLICATION = {"proxy.app", "proxy.cli", "proxy.__main__", "proxy.state", "proxy.serve", "proxy.demo", "proxy.launch",
               "proxy.workers", "proxy.crosssite", "proxy.watch", "proxy.cmdline"}
SHARED_PATH = ("proxy.protocols.pipeline", "proxy.protocols.send", "proxy.protocols.base")


def _module(path: Path) -> str:
    mod = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return mod[: -len(".__init__")] if mod.endswith(".__init__") else mod


def _exists(mod: str) -> bool:
    rel = Path(*mod.split("."))
    return (ROOT / rel.with_suffix(".py")).exists() or (ROOT / rel).is_dir()


def imports() -> dict[str, set[str]]:
    """Each module of proxy/ and the proxy modules it imports at run time."""
    out: dict[str, set[str]] = {}
    for path in PROXY.rglob("*.py"):
        tree = ast.parse(path.read_text())
        annotations_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                            and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
        found = out.setdefault(_module(path), set())
        for node in ast.walk(tree):
            if id(node) in annotations_only or not isinstance(node, ast.ImportFrom):
                continue
            if not node.module or not node.module.startswith("proxy"):
                continue
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if _exists(sub) else node.module)
    return out


def package(mod: str) -> str:
    """A module's node: its package under proxy/ (proxy.protocols.X for a protocol's), or itself
    when it sits directly in proxy/ or proxy/protocols/."""
    parts = mod.split(".")
    if len(parts) > 2 and parts[1] == "protocols":
        return ".".join(parts[:3])
    if len(parts) > 2:
        return ".".join(parts[:2])
    return mod


def is_protocol(node: str) -> bool:
    return node.startswith("proxy.protocols.") and (PROXY / "protocols" / node.split(".")[2]).is_dir()


def test_neutral_packages_and_the_core_import_no_protocol():
    bad = []
    for mod, targets in imports().items():
        node = package(mod)
        neutral = node in NEUTRAL or (mod.count(".") == 1 and mod not in APPLICATION) or mod in SHARED_PATH
        if neutral:
            bad += [f"{mod} -> {t}" for t in targets if is_protocol(package(t)) or t == "proxy.protocols.registry"]
    assert bad == []


def test_no_import_cycle_between_packages():
    graph: dict[str, set[str]] = collections.defaultdict(set)
    for mod, targets in imports().items():
        for t in targets:
            if t != "proxy" and package(t) != package(mod):
                graph[package(mod)].add(package(t))
    cycles = [c for c in _components(graph) if len(c) > 1]
    assert cycles == []


def _components(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for start in list(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                out.append(sorted(comp))
    return out


def test_the_checks_see_a_cycle_and_an_upward_import():
    """The two checks above would fail on the layout they forbid."""
    assert [c for c in _components({"a": {"b"}, "b": {"a"}, "c": {"a"}}) if len(c) > 1] == [["a", "b"]]
    assert is_protocol("proxy.protocols.chat") and not is_protocol("proxy.protocols.pipeline")
    assert package("proxy.protocols.messages.route") == "proxy.protocols.messages"
    assert package("proxy.compaction.engine") == "proxy.compaction"


def test_a_route_handler_is_at_most_40_lines():
    long = []
    for path in (PROXY / "protocols").rglob("route.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.AsyncFunctionDef) and node.name.startswith("handle"):
                if node.end_lineno - node.lineno + 1 > 40:
                    long.append(f"{path.relative_to(ROOT)}:{node.name}")
    assert long == []
