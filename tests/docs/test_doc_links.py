"""Every relative link and #anchor in README.md and docs/*.md resolves: the file exists, and an
anchor names a heading of the target page (GitHub's heading ids)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(```|~~~).*?^\1\s*$", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def prose(text: str) -> str:
    """The text without fenced code blocks (whose lines stay, empty, so numbers hold)."""
    return FENCE.sub(lambda m: "\n" * m[0].count("\n"), text)


def slug(heading: str) -> str:
    """GitHub's id for a heading: its text (code spans and links unwrapped), lower case, without
    punctuation except '-' and '_', spaces as '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: Counter[str] = Counter()
    out = set()
    for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", prose(page.read_text()), re.M):
        base = slug(m[1])
        out.add(f"{base}-{seen[base]}" if seen[base] else base)
        seen[base] += 1
    return out


def links(page: Path) -> list[tuple[int, str]]:
    text = prose(page.read_text())
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        for m in LINK.finditer(CODE_SPAN.sub("", line)):
            found.append((n, m[1]))
    return found


def test_slug_matches_githubs_ids() -> None:
    assert slug("Offline throughput (`benchmarks/offline_throughput.py`)") == (
        "offline-throughput-benchmarksoffline_throughputpy"
    )
    assert slug("int8 KV cache (`--kv-cache-dtype int8`, CPU)") == (
        "int8-kv-cache---kv-cache-dtype-int8-cpu"
    )
    assert slug("vs llama.cpp's own `llama-server`") == "vs-llamacpps-own-llama-server"
    assert slug("5. Send a request") == "5-send-a-request"


def test_pages_have_links() -> None:
    """The scan sees links at all (a broken pattern would pass every page)."""
    assert any(target == "docs/deploy.md" for _, target in links(ROOT / "README.md"))
    assert len([t for p in PAGES for _, t in links(p)]) > 20


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_relative_links_and_anchors_resolve(page: Path) -> None:
    broken = []
    for line, target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / unquote(path)).resolve() if path else page
        if not dest.exists():
            broken.append(f"line {line}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"line {line}: {target} (no heading #{anchor} in {dest.name})")
    assert broken == [], f"{page.relative_to(ROOT)}:\n" + "\n".join(broken)
