"""pagoda.runtime.cpu.build: compile once per (sources, flags, compiler, CPU), fail loudly."""

from __future__ import annotations

import ctypes
import shutil
from pathlib import Path

import pytest
from pagoda.runtime.cpu import build

FLAGS = ["-shared", "-fPIC"]


@pytest.fixture
def cc():
    found = build.find_compiler("CC", ["cc", "gcc"])
    if found is None:
        pytest.skip("no C compiler")
    return found


def _write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)
    return folder / name


def test_builds_once_per_flags_and_loads(tmp_path, cc):
    src = _write(tmp_path / "csrc", "t.c", "int answer(void) { return 42; }\n")
    out = tmp_path / "cache"
    a = build.build(src, name="t", compiler=cc, flags=FLAGS, directory=out)
    again = build.build(src, name="t", compiler=cc, flags=FLAGS, directory=out)
    other = build.build(src, name="t", compiler=cc, flags=["-O2", *FLAGS], directory=out)
    assert a == again and a != other
    assert sorted(p.name for p in out.iterdir()) == sorted([a.name, other.name])
    assert ctypes.CDLL(str(a)).answer() == 42


def test_an_included_header_is_part_of_the_key(tmp_path, cc):
    """Editing a header the source includes (beside it, or a shared one of cpu/csrc) rebuilds."""
    csrc = tmp_path / "csrc"
    _write(csrc, "value.h", '#pragma once\n#include "claim.h"\n#define VALUE 1\n')
    src = _write(csrc, "t.c", '#include "value.h"\nint value(void) { return VALUE; }\n')
    want = [src, csrc / "value.h", build.CSRC / "claim.h"]
    assert build.sources(src) == [p.resolve() for p in want]
    first = build.build(src, name="t", compiler=cc, flags=FLAGS, directory=tmp_path / "cache")
    _write(csrc, "value.h", '#pragma once\n#include "claim.h"\n#define VALUE 2\n')
    second = build.build(src, name="t", compiler=cc, flags=FLAGS, directory=tmp_path / "cache")
    assert first != second
    assert ctypes.CDLL(str(first)).value() == 1 and ctypes.CDLL(str(second)).value() == 2


def test_every_library_source_is_found():
    """The shipped libraries' includes all resolve to files (a typo would build nowhere)."""
    runtime = build.CSRC.parents[1]
    for main in [*runtime.glob("*/csrc/*.c"), *runtime.glob("*/csrc/**/*.cpp")]:
        found = build.sources(main)
        names = {p.name for p in found}
        for path in found:
            for name in build._INCLUDE.findall(path.read_text()):
                assert Path(name).name in names, f"{path.name} includes {name}, not found"


def test_a_failed_build_raises_with_the_compiler_message(tmp_path, cc):
    src = _write(tmp_path / "csrc", "broken.c", "int x(\n")
    with pytest.raises(RuntimeError, match="compiling broken failed"):
        build.build(src, name="broken", compiler=cc, flags=["-shared"], directory=tmp_path / "out")
    assert not any(p.suffix == ".so" for p in tmp_path.rglob("*"))


def test_an_explicit_compiler_is_not_second_guessed(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    assert build.find_compiler("CC", ["cc", "gcc"]) is None
    monkeypatch.delenv("CC")
    assert build.find_compiler("CC", ["cc", "gcc"]) == (shutil.which("cc") or shutil.which("gcc"))
