"""pagoda.runtime.native: compile once per (source, flags, compiler, CPU), fail loudly."""

from __future__ import annotations

import ctypes
import shutil

import pytest
from pagoda.runtime import native

SRC = "int answer(void) { return 42; }\n"


@pytest.fixture
def cc():
    found = native.find_compiler("CC", ["cc", "gcc"])
    if found is None:
        pytest.skip("no C compiler")
    return found


def test_builds_once_per_flags_and_loads(tmp_path, cc):
    a = native.build(SRC, name="t", compiler=cc, flags=["-shared", "-fPIC"], language="c",
                     directory=tmp_path)  # fmt: skip
    again = native.build(SRC, name="t", compiler=cc, flags=["-shared", "-fPIC"], language="c",
                         directory=tmp_path)  # fmt: skip
    other = native.build(SRC, name="t", compiler=cc, flags=["-O2", "-shared", "-fPIC"],
                         language="c", directory=tmp_path)  # fmt: skip
    assert a == again and a != other
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([a.name, other.name])
    assert ctypes.CDLL(str(a)).answer() == 42


def test_a_failed_build_raises_with_the_compiler_message(tmp_path, cc):
    with pytest.raises(RuntimeError, match="compiling broken failed"):
        native.build("int x(", name="broken", compiler=cc, flags=["-shared"], language="c",
                     directory=tmp_path)  # fmt: skip
    assert not any(p.suffix == ".so" for p in tmp_path.rglob("*"))


def test_an_explicit_compiler_is_not_second_guessed(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    assert native.find_compiler("CC", ["cc", "gcc"]) is None
    monkeypatch.delenv("CC")
    assert native.find_compiler("CC", ["cc", "gcc"]) == (shutil.which("cc") or shutil.which("gcc"))
