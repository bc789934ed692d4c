"""`pagoda download --prune` (prune.py) against a local Hub: after a new commit of a repo, its old
snapshot goes with the blobs only it linked, but not while a process still holds it."""

from __future__ import annotations

import pathlib

import pytest
from hub_testlib import FakeHub
from pagoda.runtime.model.sources import prune
from pagoda.runtime.model.sources.errors import DownloadError
from pagoda.runtime.model.sources.fetch import resolve_model


@pytest.fixture(autouse=True)
def _release() -> None:
    prune.release_all()  # what this process held from other tests' downloads
    yield
    prune.release_all()


def test_old_snapshots_go_once_no_process_holds_them(hub: FakeHub, tmp_path: pathlib.Path) -> None:
    old = pathlib.Path(resolve_model("hf://org/tiny", tmp_path))  # a server holds it from here on
    files = dict(hub.repos["org/tiny"].files)
    files["generation_config.json"] = b'{"do_sample": false}'
    hub.add("org/tiny", files)  # a push to main: a new commit sharing the weights
    new = pathlib.Path(resolve_model("hf://org/tiny", tmp_path, prune=True))
    assert new != old and old.is_dir()  # still held: kept
    blobs = tmp_path / "models--org--tiny" / "blobs"
    assert len(list(blobs.iterdir())) == 6  # 5 files, one changed

    prune.release_all()  # the old server exits
    assert resolve_model("hf://org/tiny", tmp_path, prune=True) == str(new)
    assert not old.exists()
    assert sorted(p.name for p in (old.parent).iterdir()) == [new.name]
    assert len(list(blobs.iterdir())) == 5  # the old config's blob went, the shared ones stayed
    assert (new / "model.safetensors").read_bytes() == files["model.safetensors"]
    assert resolve_model("hf://org/tiny", tmp_path, offline=True) == str(new)
    with pytest.raises(DownloadError) as info:  # its manifest went too: never found half there
        resolve_model(f"hf://org/tiny@{old.name}", tmp_path, offline=True)
    assert info.value.detail == "NotCached"


def test_without_prune_old_snapshots_stay(hub: FakeHub, tmp_path: pathlib.Path) -> None:
    old = pathlib.Path(resolve_model("hf://org/tiny", tmp_path))
    prune.release_all()
    hub.add("org/tiny", {**hub.repos["org/tiny"].files, "config.json": b'{"v": 2}'})
    resolve_model("hf://org/tiny", tmp_path)
    assert old.is_dir()
