"""The operator's layout (docs/operator.md, "Module map"), read with `ast` over operator/:

* layers: a module imports only from its own folder or from lower layers, type-only imports
  included (the floor is `kube/`, the top `main.py`);
* no import chain longer than MAX_CHAIN modules (imports that run: those under
  `if TYPE_CHECKING:` load nothing, as in tests/test_import_graph.py, which also rules out
  cycles between modules and between folders);
* no folder with more than MAX_MODULES modules.
"""

from __future__ import annotations

import functools
from collections import Counter

import pytest
from test_import_graph import module_graph, project_modules

PACKAGE = "pagoda.operator"
# Lowest first. Each entry is a folder (subpackage) or a module at the top of operator/.
LAYERS = (
    "kube",  # names (the bottom floor), the API client, locks, drift, RBAC
    "web",  # the HTTP port: /healthz, /readyz, /metrics
    "spec",  # parsing + validation, status, the operator's settings
    "autotune",  # tuning Jobs, profiles, the mount, the predictive floor
    "autoscaling",  # policy, Prometheus, alerts, the autoscaler loop
    "children",  # pure builders of the manifests
    "reconcile",  # apply children, write status, retries, resync
    "handlers",  # thin kopf handlers
    "flags",  # `pagoda operator`'s flags -> OperatorConfig
    "main",  # CLI, kopf settings, serve()
)
MAX_CHAIN = 7
MAX_MODULES = 10


def layer(module: str) -> int:
    """The rank of a `pagoda.operator` module in LAYERS (the package itself is below all)."""
    if module == PACKAGE:
        return -1
    return LAYERS.index(module.removeprefix(PACKAGE + ".").split(".")[0])


@functools.cache  # the tree does not change during a run: each graph is parsed once
def operator_graph(*, typing: bool = False) -> dict[str, set[str]]:
    """The operator's modules → the operator modules they import (read only: shared)."""
    graph = module_graph(typing=typing)
    inside = {m for m in graph if m == PACKAGE or m.startswith(PACKAGE + ".")}
    return {m: graph[m] & inside for m in inside}


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) pairs that go to a higher layer, or sideways to another folder."""
    bad = []
    for module, targets in graph.items():
        for target in targets:
            if layer(target) > layer(module) or (
                layer(target) == layer(module)
                and target.rpartition(".")[0] != module.rpartition(".")[0]
            ):
                bad.append((module, target))
    return sorted(bad)


def longest_chain(graph: dict[str, set[str]]) -> list[str]:
    """The longest path of imports (a list of modules), in a graph without cycles."""

    @functools.cache
    def longest_from(module: str) -> tuple[str, ...]:
        below = [longest_from(t) for t in sorted(graph.get(module, ()))]
        return (module, *max(below, key=len, default=()))

    return list(max((longest_from(m) for m in sorted(graph)), key=len, default=()))


def test_every_module_has_a_layer() -> None:
    for module in operator_graph():
        layer(module)  # ValueError names a folder or module missing from LAYERS


def test_imports_go_down_the_layers() -> None:
    assert upward_imports(operator_graph(typing=True)) == []


def test_import_chains_are_short() -> None:
    chain = longest_chain(operator_graph())
    assert len(chain) <= MAX_CHAIN, " -> ".join(chain)


def test_folders_stay_small() -> None:
    folders = Counter(
        module.rpartition(".")[0]
        for module, path in project_modules().items()
        if module.startswith(PACKAGE + ".") and path.name != "__init__.py"
    )
    assert {f: n for f, n in folders.items() if n > MAX_MODULES} == {}


def test_the_checks_can_fail() -> None:
    up = {
        "pagoda.operator.kube.names": {"pagoda.operator.spec.fields"},
        "pagoda.operator.spec.fields": set(),
    }
    assert upward_imports(up) == [("pagoda.operator.kube.names", "pagoda.operator.spec.fields")]
    down = {"pagoda.operator.main": {"pagoda.operator.handlers"}, "pagoda.operator.handlers": set()}
    assert upward_imports(down) == []
    sideways = {
        "pagoda.operator.spec.a": {"pagoda.operator.spec.b"},
        "pagoda.operator.spec.b": set(),
    }
    assert upward_imports(sideways) == []
    assert longest_chain({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == ["a", "b", "c"]
    with pytest.raises(ValueError):
        layer("pagoda.operator.somewhere_new")
