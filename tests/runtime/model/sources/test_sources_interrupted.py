"""Downloads cut short: the connection dropped mid-file, the process killed mid-file, two
processes at once on one directory; what is left must never be served as a checkpoint."""

from __future__ import annotations

import hashlib
import pathlib
import signal
import subprocess
import sys
import time

import pytest
from hub_testlib import FakeHub
from pagoda.runtime.model.sources import cache
from pagoda.runtime.model.sources.fetch import resolve_model
from pagoda.runtime.model.sources.uri import parse_uri

ROOT = pathlib.Path(__file__).resolve().parents[4]
EXTRA = "extra.safetensors"  # org/big's 256 KiB weights file
CHUNK = 16 << 10  # huggingface_hub writes what it received in chunks of this (10 MiB unless set)
# `pagoda download`, with huggingface_hub writing 16 KiB chunks (a small file gets some on disk)
MAIN = (
    f"import sys, huggingface_hub.constants as c; c.DOWNLOAD_CHUNK_SIZE = {CHUNK}; "
    "from pagoda.runtime.cli import main; sys.exit(main())"
)


def download(root: pathlib.Path, uri: str = "hf://org/big") -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-P", "-c", MAIN, "download", "--model", uri, "--download-dir", str(root)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip


def test_a_dropped_connection_resumes_with_a_range_request(
    hub: FakeHub, tmp_path: pathlib.Path, big_checkpoint: pathlib.Path, monkeypatch
) -> None:
    """huggingface_hub's own retry: the rest of the file is asked for with a Range."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", CHUNK)
    hub.cut_after[EXTRA] = 6 * CHUNK
    path = pathlib.Path(resolve_model("hf://org/big", tmp_path))
    assert (path / EXTRA).read_bytes() == (big_checkpoint / EXTRA).read_bytes()
    asked = [r for n, r in hub.ranges if n == EXTRA]
    assert asked == [None, f"bytes={6 * CHUNK}-"], asked


def test_a_killed_download_resumes_where_it_stopped(
    hub: FakeHub, tmp_path: pathlib.Path, big_checkpoint: pathlib.Path
) -> None:
    """`pagoda download` killed (SIGKILL) in the middle of a file: the next download asks for
    the rest of that file only, and what it serves is the file (its SHA-256 was checked)."""
    hub.stall_after[EXTRA] = 6 * CHUNK
    proc = download(tmp_path)
    blobs = tmp_path / "models--org--big" / "blobs"
    deadline = time.monotonic() + 60
    while not any(p.stat().st_size >= 6 * CHUNK for p in blobs.glob("*.incomplete")):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert cache.lookup(tmp_path, parse_uri("hf://org/big")) is None
    hub.stall_after.clear()
    hub.release.set()
    hub.ranges.clear()
    path = pathlib.Path(resolve_model("hf://org/big", tmp_path))
    assert (path / EXTRA).read_bytes() == (big_checkpoint / EXTRA).read_bytes()
    assert [r for n, r in hub.ranges if n == EXTRA] == [f"bytes={6 * CHUNK}-"], hub.ranges
    assert not list(blobs.glob("*.incomplete"))


def test_a_leftover_that_is_not_the_start_of_its_file_is_not_served(
    hub: FakeHub, tmp_path: pathlib.Path, big_checkpoint: pathlib.Path
) -> None:
    """A leftover whose bytes are not the file's (a crashed node, another writer): the resumed
    file fails its SHA-256 check and is downloaded whole instead."""
    want = (big_checkpoint / EXTRA).read_bytes()
    blobs = tmp_path / "models--org--big" / "blobs"
    blobs.mkdir(parents=True)
    (blobs / f"{hashlib.sha256(want).hexdigest()}.0badf00d.incomplete").write_bytes(b"\xff" * 4096)
    path = pathlib.Path(resolve_model("hf://org/big", tmp_path))
    assert (path / EXTRA).read_bytes() == want
    assert [r for n, r in hub.ranges if n == EXTRA] == ["bytes=4096-", None], hub.ranges


def test_a_server_that_refuses_to_resume_sends_the_whole_file(
    hub: FakeHub, tmp_path: pathlib.Path, big_checkpoint: pathlib.Path
) -> None:
    want = (big_checkpoint / EXTRA).read_bytes()
    blobs = tmp_path / "models--org--big" / "blobs"
    blobs.mkdir(parents=True)
    (blobs / f"{hashlib.sha256(want).hexdigest()}.0badf00d.incomplete").write_bytes(want[:4096])
    hub.refuse_ranges = True
    path = pathlib.Path(resolve_model("hf://org/big", tmp_path))
    assert (path / EXTRA).read_bytes() == want
    assert [r for n, r in hub.ranges if n == EXTRA] == ["bytes=4096-", None], hub.ranges
    assert not list(blobs.glob("*.incomplete"))


@pytest.mark.filterwarnings("ignore:flock not supported")  # filelock's, for huggingface_hub
@pytest.mark.parametrize("source", ["hf", "s3"])
def test_without_locks_what_looks_left_over_is_left_alone(
    request: pytest.FixtureRequest,
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    source: str,
) -> None:
    """A filesystem that cannot lock (ENOSYS, as FUSE ones without flock say): another pod may be writing the `*.incomplete` /
    `.NAME.partial-*` file this one finds, so it is neither completed nor removed, and this
    download still completes with files of its own."""
    import errno
    import fcntl

    def no_locks(fd: int, op: int) -> None:
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    if source == "hf":
        request.getfixturevalue("hub")
        uri, name = "hf://org/big", EXTRA
        folder = tmp_path / "models--org--big" / "blobs"
        want = request.getfixturevalue("big_checkpoint") / EXTRA
        other = folder / f"{hashlib.sha256(want.read_bytes()).hexdigest()}.1234abcd.incomplete"
    else:
        request.getfixturevalue("s3")
        uri, name = "s3://models/tiny", "model.safetensors"
        folder = tmp_path / "s3" / "models" / "tiny"
        want = request.getfixturevalue("checkpoint") / name
        other = folder / f".{name}.partial-1234abcd"
    folder.mkdir(parents=True)
    other.write_bytes(want.read_bytes()[:4096])
    path = pathlib.Path(resolve_model(uri, tmp_path))
    assert (path / name).read_bytes() == want.read_bytes()
    assert other.read_bytes() == want.read_bytes()[:4096]
    assert "downloading without the lock" in caplog.text
