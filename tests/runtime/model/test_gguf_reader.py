"""`gguf_reader`'s sharing: a process's start-up reads of one GGUF parse it once, a changed or
replaced file is parsed anew, and no reader is kept once the last read took it (or, untaken,
after `SHARE_S`)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
from pagoda.runtime import options
from pagoda.runtime.model import gguf_reader
from pagoda.runtime.model.loader import load_model, read_tokenizer, resolve_model_path

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def parses(monkeypatch) -> list[str]:
    """The paths `gguf_reader.parse` is called with, from a state with nothing shared and no
    weights count cached."""
    from pagoda.runtime.server import checkpoint_table

    calls: list[str] = []
    real = gguf_reader.parse

    def counted(path):
        calls.append(os.path.abspath(path))
        return real(path)

    monkeypatch.setattr(gguf_reader, "parse", counted)
    gguf_reader.forget_all()
    checkpoint_table._read.cache_clear()
    yield calls
    gguf_reader.forget_all()
    checkpoint_table._read.cache_clear()


def write_gguf(path: Path, text: str) -> None:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_string("t.text", text)
    w.add_array("t.words", ["a", "b", text])
    w.add_tensor("w", np.arange(6, dtype=np.float32).reshape(2, 3))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_a_start_up_parses_the_gguf_once(parses):
    """`pagoda serve`'s checks (config, the weights count of `fit` and `memory`), then its last
    read: the API process's tokenizer (engine in its own process) or the load (engine on a
    thread). One parse each way, and no reader (no memory map) kept after."""
    from pagoda.runtime.server import checkpoint_table
    from pagoda.runtime.server.cli import build_parser, server_config
    from pagoda.runtime.server.launch import preflight

    path = os.path.abspath(resolve_model_path("smollm2-135m"))
    args = build_parser().parse_args(["--max-model-len", "512"])
    for last_read in (read_tokenizer, load_model):
        engine_cfg, _ = preflight(server_config(args), options.engine_kwargs(vars(args)))
        assert gguf_reader._shared.keys() == {path}  # held between the checks and the last read
        last_read(engine_cfg.model)
        assert parses == [path], last_read
        assert not gguf_reader._shared, last_read
        parses.clear()
        checkpoint_table._read.cache_clear()


def test_a_changed_or_replaced_file_is_parsed_anew(tmp_path, parses):
    path = tmp_path / "m.gguf"
    write_gguf(path, "one")
    first = gguf_reader.open_reader(path)
    assert gguf_reader.open_reader(str(path)) is first and len(parses) == 1
    write_gguf(path, "three")  # rewritten in place, another size
    second = gguf_reader.open_reader(path)
    assert second.fields["t.text"].contents() == "three" and len(parses) == 2
    assert second.fields["t.words"].contents() == ["a", "b", "three"]
    assert first is not second
    stat = path.stat()
    write_gguf(path, "thre3")  # same size, in place: its mtime tells
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert gguf_reader.open_reader(path).fields["t.text"].contents() == "thre3"
    stat = path.stat()
    write_gguf(tmp_path / "new.gguf", "3hree")  # same size and mtime, renamed over it: its inode
    os.utime(tmp_path / "new.gguf", ns=(stat.st_atime_ns, stat.st_mtime_ns))
    os.replace(tmp_path / "new.gguf", path)
    assert gguf_reader.open_reader(path).fields["t.text"].contents() == "3hree"
    assert len(parses) == 4 and list(gguf_reader._shared) == [str(path)]  # old ones let go


def mapped(path: Path) -> bool:
    """Whether this process maps the file (Linux)."""
    with open("/proc/self/maps") as maps:
        return any(line.rstrip().endswith(os.path.realpath(path)) for line in maps)


def test_the_last_read_takes_the_reader_and_the_rest_are_let_go(tmp_path, parses, monkeypatch):
    paths = [tmp_path / f"m{i}.gguf" for i in range(3)]
    for i, p in enumerate(paths):
        write_gguf(p, f"model {i}")
    shared = gguf_reader.open_reader(paths[0])
    assert gguf_reader.take_reader(paths[0]) is shared and not gguf_reader._shared
    assert mapped(paths[0])
    del shared
    assert not mapped(paths[0])  # the taker's objects alone held the map
    gguf_reader.take_reader(paths[0])  # nothing shared: parsed again, kept by nobody
    assert not gguf_reader._shared and len(parses) == 2 and not mapped(paths[0])
    for p in paths:
        gguf_reader.open_reader(p)
    assert list(gguf_reader._shared) == [str(p) for p in paths[-gguf_reader.MAX_SHARED :]]
    gguf_reader.forget_all()
    assert not any(mapped(p) for p in paths)
    monkeypatch.setattr(gguf_reader, "SHARE_S", 0.05)
    gguf_reader.open_reader(paths[0])
    deadline = time.monotonic() + 5
    while gguf_reader._shared and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not gguf_reader._shared and not mapped(paths[0])  # untaken: let go after SHARE_S


def test_a_file_that_does_not_parse_is_the_same_error_and_nothing_is_shared(tmp_path, parses):
    missing, junk = tmp_path / "missing.gguf", tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all")
    with pytest.raises(FileNotFoundError, match=r"missing\.gguf"):
        gguf_reader.open_reader(missing)
    for path in (junk, junk):  # failures are not remembered: each read tries again
        with pytest.raises(ValueError, match="GGUF magic invalid"):
            gguf_reader.open_reader(path)
    assert not gguf_reader._shared and len(parses) == 3


def test_pagoda_serve_on_a_cut_gguf_says_so_in_one_line_and_exits_2(tmp_path):
    cut = tmp_path / "cut.gguf"
    with open(resolve_model_path("smollm2-135m"), "rb") as f:
        cut.write_bytes(f.read(400_000))  # inside tokenizer.ggml.tokens
    result = subprocess.run(
        [sys.executable, "-P", "-m", "pagoda.runtime.cli", "serve", "--port", "0",
         "--no-engine-process", "--model", str(cut)],
        capture_output=True, text=True, timeout=180, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "ends inside a metadata array" in lines[0], result.stderr
