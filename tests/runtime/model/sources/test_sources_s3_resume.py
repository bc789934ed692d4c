"""s3:// downloads cut short mid-object go on with the parts they lack (s3_parts: ranged GETs
with If-Match), and an object that changed meanwhile starts over, against moto's S3 server."""

from __future__ import annotations

import logging
import os
import pathlib

import pytest
from pagoda.runtime.model.sources import s3_parts
from pagoda.runtime.model.sources.errors import DownloadError
from pagoda.runtime.model.sources.fetch import resolve_model
from pagoda.runtime.model.sources.progress import Progress
from s3_testlib import MotoS3

PART = 64 << 10
BIG = 10 * PART + 123  # 11 parts, the last one short
URI = "s3://models/resume"


class Meter:
    """Progress.add, counting the bytes that arrive and raising (a kill) past `cut_after`."""

    def __init__(self) -> None:
        self.fetched = 0
        self.cut_after: int | None = None

    def add(self, _progress: Progress, n: int) -> None:
        self.fetched += n
        if self.cut_after is not None and self.fetched > self.cut_after:
            raise RuntimeError("cut short")


@pytest.fixture
def meter(s3: MotoS3, checkpoint: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Meter:
    """s3://models/resume: the tiny checkpoint with a BIG model.safetensors, fetched in PART
    parts by 3 workers."""
    client = s3.client()
    for path in checkpoint.iterdir():
        if path.is_file() and path.name != "model.safetensors":
            client.put_object(Bucket="models", Key=f"resume/{path.name}", Body=path.read_bytes())
    monkeypatch.setattr(s3_parts, "PART_BYTES", PART)
    monkeypatch.setattr(s3_parts, "WORKERS", 3)
    meter = Meter()
    monkeypatch.setattr(Progress, "add", lambda self, n: meter.add(self, n))
    return meter


def cut_short(meter: Meter, root: pathlib.Path, after: int) -> None:
    meter.cut_after, meter.fetched = after, 0
    with pytest.raises(DownloadError):
        resolve_model(URI, root)
    meter.cut_after, meter.fetched = None, 0


def test_a_download_cut_short_mid_object_fetches_only_the_parts_it_lacks(
    s3: MotoS3, meter: Meter, tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pagoda.runtime.model.sources")
    weights = os.urandom(BIG)
    s3.client().put_object(Bucket="models", Key="resume/model.safetensors", Body=weights)
    cut_short(meter, tmp_path, after=5 * PART)
    folder = tmp_path / "s3" / "models" / "resume"
    assert (folder / ".model.safetensors.partial").is_file()
    path = pathlib.Path(resolve_model(URI, tmp_path))
    assert "resuming at" in caplog.text
    assert 0 < meter.fetched < BIG - 3 * PART, meter.fetched  # ≥ 4 parts kept (+ small files)
    assert (path / "model.safetensors").read_bytes() == weights
    assert sorted(p.name for p in folder.glob(".model.safetensors*")) == []  # no leftovers
    assert resolve_model(URI, tmp_path, offline=True) == str(path)


def test_an_object_changed_since_the_cut_starts_over(
    s3: MotoS3, meter: Meter, tmp_path: pathlib.Path
) -> None:
    s3.client().put_object(Bucket="models", Key="resume/model.safetensors", Body=os.urandom(BIG))
    cut_short(meter, tmp_path, after=5 * PART)
    weights = os.urandom(BIG)  # a new ETag, the same size
    s3.client().put_object(Bucket="models", Key="resume/model.safetensors", Body=weights)
    path = pathlib.Path(resolve_model(URI, tmp_path))
    assert BIG <= meter.fetched < BIG + PART  # every part again (+ the small files after it)
    assert (path / "model.safetensors").read_bytes() == weights
