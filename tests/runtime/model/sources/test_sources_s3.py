"""s3:// through boto3 against moto's S3 server on loopback: download, offline lookup, changed
objects fetched again, a single GGUF object, and the failure classes."""

from __future__ import annotations

import pathlib

import pytest
from pagoda.runtime.model.sources.errors import DownloadError
from pagoda.runtime.model.sources.fetch import resolve_model
from s3_testlib import MotoS3


def failure(uri: str, root: pathlib.Path, **kw: object) -> DownloadError:
    with pytest.raises(DownloadError) as info:
        resolve_model(uri, root, **kw)
    assert "\n" not in str(info.value)
    return info.value


def test_download_then_offline_then_only_changed_objects(
    s3: MotoS3, tmp_path: pathlib.Path, checkpoint: pathlib.Path
) -> None:
    path = pathlib.Path(resolve_model("s3://models/tiny/", tmp_path))
    assert path == tmp_path / "s3" / "models" / "tiny"
    names = sorted(p.name for p in path.iterdir() if not p.name.startswith("."))
    assert names == sorted(
        ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
         "tokenizer_config.json"]
    )  # fmt: skip
    assert (path / "model.safetensors").read_bytes() == (
        checkpoint / "model.safetensors"
    ).read_bytes()
    assert resolve_model("s3://models/tiny", tmp_path, offline=True) == str(path)

    stamp = (path / "model.safetensors").stat().st_mtime_ns
    s3.client().put_object(Bucket="models", Key="tiny/generation_config.json", Body=b'{"x": 1}')
    try:
        assert resolve_model("s3://models/tiny", tmp_path) == str(path)
        assert (path / "generation_config.json").read_bytes() == b'{"x": 1}'  # changed: fetched
        assert (path / "model.safetensors").stat().st_mtime_ns == stamp  # unchanged: kept
    finally:
        s3.upload_dir("models", "tiny", checkpoint)


def test_a_single_gguf_object(s3: MotoS3, tmp_path: pathlib.Path) -> None:
    path = resolve_model("s3://models/gguf/tiny.gguf", tmp_path)
    assert path == str(tmp_path / "s3" / "models" / "gguf" / "tiny.gguf")
    assert pathlib.Path(path).read_bytes().startswith(b"GGUF")
    assert resolve_model("s3://models/gguf/tiny.gguf", tmp_path, offline=True) == path


@pytest.mark.parametrize(
    ("uri", "words"),
    [
        ("s3://models/nothing-here", "no objects under s3://models/nothing-here/"),
        ("s3://no-such-bucket/x", "NoSuchBucket"),
        ("s3://models/gguf", "no config.json"),
    ],
)
def test_not_found(s3: MotoS3, tmp_path: pathlib.Path, uri: str, words: str) -> None:
    err = failure(uri, tmp_path)
    assert err.detail == "NotFound" and words in str(err), str(err)


def test_unauthorized(s3: MotoS3, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with s3.require_auth():
        assert resolve_model("s3://models/tiny", tmp_path / "a")  # the Secret's key works
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
        err = failure("s3://models/tiny", tmp_path / "b")
        assert err.detail == "Unauthorized" and "SignatureDoesNotMatch" in str(err), str(err)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAUNKNOWN000000000")
        err = failure("s3://models/tiny", tmp_path / "c")
        assert err.detail == "Unauthorized" and "InvalidAccessKeyId" in str(err), str(err)


def test_out_of_space(s3: MotoS3, tmp_path: pathlib.Path) -> None:
    err = failure("s3://models/tiny", tmp_path, size_limit=4096)
    assert err.detail == "OutOfSpace" and "size limit" in str(err)
    assert not (tmp_path / "s3").exists()


def test_unreachable(s3: MotoS3, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    err = failure("s3://models/tiny", tmp_path)
    assert err.detail == "Unreachable" and "127.0.0.1:9" in str(err), str(err)
