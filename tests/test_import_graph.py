"""No import cycles in pagoda.runtime, pagoda.operator and pagoda.kernels: neither between
modules nor between folders (a folder's modules taken together).

Every import counts, also those inside functions (a lazy import still ties the two modules
together); imports under ``if TYPE_CHECKING:`` do not (they never run). The graph is read with
``ast``, so nothing is imported and the test needs no torch.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"runtime": "pagoda.runtime", "operator": "pagoda.operator", "kernels": "pagoda.kernels"}
# Known cycles allowed while they are being removed (none now); a new cycle fails the test.
KNOWN_CYCLES: list[list[str]] = []


def project_modules() -> dict[str, Path]:
    found = {}
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


def _runtime_imports(tree: ast.AST, *, typing: bool = False):
    """Import nodes, skipping the bodies of ``if TYPE_CHECKING:`` unless `typing`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if not typing and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def module_graph(*, typing: bool = False) -> dict[str, set[str]]:
    """module → the project modules it imports (with `typing`, also under TYPE_CHECKING)."""
    modules = project_modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in _runtime_imports(ast.parse(path.read_text(), str(path)), typing=typing):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    base = f"{anchor}.{base}".rstrip(".")
                # `from pkg import sub` ties to pkg.sub; `from pkg import name` to pkg
                names = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                    for a in node.names
                ]
            for name in names:
                while name and name not in modules:
                    name = name.rpartition(".")[0]
                if name and name != module:
                    graph[module].add(name)
    return graph


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """folder (the package a module sits in; a package's ``__init__`` sits in it) → folders."""
    modules = project_modules()

    def folder(m: str) -> str:
        return m if modules[m].name == "__init__.py" else m.rpartition(".")[0]

    out: dict[str, set[str]] = defaultdict(set)
    for module, targets in graph.items():
        src = folder(module)
        out[src] |= {folder(t) for t in targets if folder(t) != src}
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_module_level_cycles() -> None:
    new = [c for c in cycles(module_graph()) if c not in KNOWN_CYCLES]
    assert new == []


def test_no_folder_level_cycles() -> None:
    new = [c for c in cycles(folder_graph(module_graph())) if c not in KNOWN_CYCLES]
    assert new == []


def test_the_graph_sees_imports() -> None:
    """A lazy import counts; `from pkg import submodule` points at the submodule."""
    graph = module_graph()
    assert "pagoda.runtime.server.launch" in graph["pagoda.runtime.server.cli"]  # lazy
    assert "pagoda.runtime.tuned_profile" in graph["pagoda.operator.autotune.publish"]
    assert "pagoda.runtime.engine" not in graph["pagoda.runtime.engine.core"]


def test_the_cycle_finder_finds_cycles() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
