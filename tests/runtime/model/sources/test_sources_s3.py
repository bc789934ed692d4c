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
        ("s3://models/gguf", "holds GGUF files (tiny.gguf)"),
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


def test_keys_from_a_file_with_its_newline_work(
    s3: MotoS3, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Secret made with `--from-file` keeps the file's newline."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, s3.env[name] + "\n")
    with s3.require_auth():
        assert resolve_model("s3://models/tiny", tmp_path)


def test_out_of_space(s3: MotoS3, tmp_path: pathlib.Path) -> None:
    err = failure("s3://models/tiny", tmp_path, size_limit=4096)
    assert err.detail == "OutOfSpace" and "size limit" in str(err)
    assert not (tmp_path / "s3").exists()


def test_unreachable(s3: MotoS3, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    err = failure("s3://models/tiny", tmp_path)
    assert err.detail == "Unreachable" and "127.0.0.1:9" in str(err), str(err)


def test_a_download_cut_short_resumes_with_the_file_it_was_on(
    s3: MotoS3, tmp_path: pathlib.Path
) -> None:
    """The files finished before the cut are kept (not fetched again); what the cut process
    left half-written is removed."""
    local = tmp_path / "s3" / "models" / "tiny"
    (local / "tokenizer.json").mkdir(parents=True)  # cuts the download at that file (sorted)
    err = failure("s3://models/tiny", tmp_path)
    assert err.detail == "Failed", str(err)
    (local / "tokenizer.json").rmdir()
    kept = {n: (local / n).stat().st_mtime_ns for n in ("config.json", "model.safetensors")}
    leftover = local / ".model.safetensors.partial.0a1B2c3D"  # boto3's temporary, after a kill
    leftover.write_bytes(b"\0" * 100)
    path = pathlib.Path(resolve_model("s3://models/tiny", tmp_path))
    assert {n: (path / n).stat().st_mtime_ns for n in kept} == kept
    assert (path / "tokenizer.json").is_file() and not leftover.exists()
    assert resolve_model("s3://models/tiny", tmp_path, offline=True) == str(path)


def test_no_credentials_and_an_anonymous_request_refused(
    s3: MotoS3, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with s3.require_auth():
        err = failure("s3://models/tiny", tmp_path)
    assert err.detail == "Unauthorized" and "no AWS credentials" in str(err), str(err)


def test_the_prefix_is_a_folder_with_or_without_its_slash(
    s3: MotoS3, tmp_path: pathlib.Path, checkpoint: pathlib.Path
) -> None:
    """`s3://models/tiny` never takes `tiny-v2/`'s objects, and `tiny/` is the same model."""
    s3.client().put_object(Bucket="models", Key="tiny-v2/config.json", Body=b'{"v": 2}')
    a = resolve_model("s3://models/tiny", tmp_path)
    assert resolve_model("s3://models/tiny/", tmp_path, offline=True) == a
    assert (pathlib.Path(a) / "config.json").read_bytes() == (
        checkpoint / "config.json"
    ).read_bytes()


def test_a_large_object_comes_in_parts(
    s3: MotoS3, tmp_path: pathlib.Path, checkpoint: pathlib.Path
) -> None:
    """Above boto3's 8 MiB threshold an object is uploaded and fetched in parts (threads)."""
    import numpy as np
    from safetensors.numpy import save_file

    src = tmp_path / "src"
    src.mkdir()
    for name in ("config.json", "tokenizer.json"):
        (src / name).write_bytes((checkpoint / name).read_bytes())
    big = np.random.default_rng(0).standard_normal(9 << 18).astype(np.float32)  # 9 MiB
    save_file({"w": big}, str(src / "model.safetensors"))
    s3.upload_dir("models", "large", src)
    head = s3.client().head_object(Bucket="models", Key="large/model.safetensors")
    assert "-" in head["ETag"]  # a multipart object's ETag
    path = pathlib.Path(resolve_model("s3://models/large", tmp_path / "dl"))
    assert (path / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()
    assert resolve_model("s3://models/large", tmp_path / "dl") == str(path)  # kept, not fetched


def test_two_gguf_objects_of_one_folder_keep_each_other(s3: MotoS3, tmp_path: pathlib.Path) -> None:
    """Two single-file models side by side: fetching one never makes the other stale."""
    s3.client().put_object(Bucket="models", Key="ggufs/a.gguf", Body=b"GGUF" + b"a" * 60)
    s3.client().put_object(Bucket="models", Key="ggufs/b.gguf", Body=b"GGUF" + b"b" * 60)
    a = pathlib.Path(resolve_model("s3://models/ggufs/a.gguf", tmp_path))
    stamp = a.stat().st_mtime_ns
    b = pathlib.Path(resolve_model("s3://models/ggufs/b.gguf", tmp_path))
    assert a.parent == b.parent and b.read_bytes().endswith(b"b")
    assert resolve_model("s3://models/ggufs/a.gguf", tmp_path) == str(a)
    assert a.stat().st_mtime_ns == stamp  # not fetched again


def test_a_prefix_one_level_too_high_names_the_model_below(
    s3: MotoS3, tmp_path: pathlib.Path
) -> None:
    """`s3://models/org` when the model is in `org/llama/3b/`: NotFound naming that prefix."""
    s3.upload_dir(
        "models", "org/llama/3b", pathlib.Path(resolve_model("s3://models/tiny", tmp_path))
    )
    err = failure("s3://models/org", tmp_path)
    assert err.detail == "NotFound" and "s3://models/org/llama/3b/" in str(err), err
    assert resolve_model("s3://models/org/llama/3b", tmp_path)


def test_a_lora_adapter_prefix(s3: MotoS3, tmp_path: pathlib.Path) -> None:
    """A PEFT adapter's objects (adapter_config.json + adapter_model.safetensors, no
    config.json): downloaded (its README left out), then found offline."""
    files = {"adapter_config.json": b'{"peft_type": "LORA", "r": 8}',
             "adapter_model.safetensors": b"\0" * 64, "README.md": b"# adapter\n"}  # fmt: skip
    for name, body in files.items():
        s3.client().put_object(Bucket="models", Key=f"lora/sql/{name}", Body=body)
    path = pathlib.Path(resolve_model("s3://models/lora/sql", tmp_path))
    assert path == tmp_path / "s3" / "models" / "lora" / "sql"
    names = sorted(p.name for p in path.iterdir() if not p.name.startswith("."))
    assert names == ["adapter_config.json", "adapter_model.safetensors"]
    assert resolve_model("s3://models/lora/sql", tmp_path, offline=True) == str(path)


def test_the_region_from_aws_region(s3: MotoS3, monkeypatch: pytest.MonkeyPatch) -> None:
    """AWS_REGION (what EKS, ECS and the other AWS SDKs set; botocore reads only
    AWS_DEFAULT_REGION) is the region the requests are signed for; AWS_DEFAULT_REGION wins."""
    from pagoda.runtime.model.sources.s3 import client

    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    assert client().meta.region_name == "eu-west-1"
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-central-1")
    assert client().meta.region_name == "eu-central-1"
