"""Fixtures of the model-source tests: a tiny checkpoint, a local Hub and a local S3."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest
from hub_testlib import FakeHub, tiny_checkpoint
from s3_testlib import MotoS3

HF_TOKEN = "hf_test_token"


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def big_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The tiny checkpoint plus a 256 KiB weights file (more than the small disks hold)."""
    return tiny_checkpoint(tmp_path_factory.mktemp("big"), pad_bytes=256 << 10)


@pytest.fixture
def hub(
    checkpoint: pathlib.Path, big_checkpoint: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[FakeHub]:
    """The Hub on loopback: org/tiny (public), org/private, org/big; HF_ENDPOINT/HF_TOKEN set."""
    with FakeHub(token=HF_TOKEN) as h:
        h.add_dir("org/tiny", checkpoint)
        h.add_dir("org/private", checkpoint, private=True)
        h.add_dir("org/big", big_checkpoint)
        h.add("org/readme-only", {"README.md": b"# nothing to serve\n"})
        monkeypatch.setenv("HF_ENDPOINT", h.endpoint)
        monkeypatch.setenv("HF_TOKEN", HF_TOKEN)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        yield h


@pytest.fixture(scope="session")
def moto_s3(checkpoint: pathlib.Path) -> Iterator[MotoS3]:
    s3 = MotoS3().start()
    s3.upload_dir("models", "tiny", checkpoint)
    s3.client().put_object(Bucket="models", Key="gguf/tiny.gguf", Body=b"GGUF" + b"\0" * 60)
    yield s3
    s3.stop()


@pytest.fixture
def s3(moto_s3: MotoS3, monkeypatch: pytest.MonkeyPatch) -> MotoS3:
    for k, v in moto_s3.env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return moto_s3


@pytest.fixture
def small_disk(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    """A 192 KiB tmpfs (a full disk for real: writes past it fail with ENOSPC); skipped where
    mounting is not allowed (not root, or no CAP_SYS_ADMIN in the container)."""
    import subprocess

    mnt = tmp_path / "small-disk"
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=192k", "tmpfs", str(mnt)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()[:200]}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
