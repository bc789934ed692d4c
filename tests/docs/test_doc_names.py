"""Every `pagoda.…` module, function or constant that README.md and docs/*.md name exists: the
module imports and each attribute after it is there (a renamed or moved function breaks this)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Not after a letter, dot, slash or dash: `serving.pagoda.dev`, `charts/pagoda/...` are no names;
# nor before a slash: `pagoda.dev/resolve-model` is an annotation key.
DOTTED = re.compile(r"(?<![\w./-])pagoda(?:\.[A-Za-z_]\w*)+(?![\w/])")
FILE_SUFFIXES = (".yaml", ".yml", ".json", ".md", ".py", ".txt")


def dotted_names(text: str) -> set[str]:
    return {m[0] for m in DOTTED.finditer(text) if not m[0].endswith(FILE_SUFFIXES)}


def resolves(name: str) -> bool:
    """The longest importable module prefix of `name`, then getattr for the rest."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        module_name = ".".join(parts[:i])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name and (module_name + ".").startswith(e.name + "."):
                continue  # this prefix is no module: try a shorter one
            raise  # the module exists and imports something missing: a real error
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_the_scan_finds_names_and_the_check_can_fail() -> None:
    text = ("`pagoda.kernels.fp8.fp8_linear`, serving.pagoda.dev, `pagoda.yaml`, pagoda.runtime, "
            "`pagoda.dev/resolve-model`")  # fmt: skip
    assert dotted_names(text) == {"pagoda.kernels.fp8.fp8_linear", "pagoda.runtime"}
    assert resolves("pagoda.kernels.fp8.fp8_linear") and resolves("pagoda.kernels.linear")
    assert not resolves("pagoda.kernels.reference.fused_experts")
    assert not resolves("pagoda.runtime.no_such_module")
    assert len(set().union(*(dotted_names(p.read_text()) for p in PAGES))) > 15


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_named_modules_and_attributes_exist(page: Path) -> None:
    missing = sorted(n for n in dotted_names(page.read_text()) if not resolves(n))
    assert missing == [], f"{page.relative_to(ROOT)} names what the code lacks: {missing}"
