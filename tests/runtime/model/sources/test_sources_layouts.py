"""Checkpoints as repositories hold them, and the download directory as others fill it: a
sharded copy beside a consolidated one (only what the loader reads is fetched), a revision found
offline under each of its names, a snapshot huggingface_hub itself downloaded, gated repos, and
processes sharing one directory (one downloads, the others wait)."""

from __future__ import annotations

import json
import logging
import pathlib
import threading

import pytest
from hub_testlib import FakeHub
from pagoda.runtime.model.sources import cache
from pagoda.runtime.model.sources.errors import DownloadError
from pagoda.runtime.model.sources.fetch import resolve_model
from pagoda.runtime.model.sources.uri import parse_uri
from s3_testlib import MotoS3

SHARD = "model-00001-of-00001.safetensors"
SHARDED = sorted(["config.json", "generation_config.json", "model.safetensors.index.json", SHARD,
                  "tokenizer.json", "tokenizer_config.json"])  # fmt: skip


def mistral_layout(checkpoint: pathlib.Path) -> dict[str, bytes]:
    """The tiny checkpoint as Mistral's repos hold theirs: shards named by an index, and the
    same weights again as consolidated.safetensors (+ a .bin copy and another index)."""
    from safetensors import safe_open

    files = {p.name: p.read_bytes() for p in checkpoint.iterdir() if p.is_file()}
    weights = files.pop("model.safetensors")
    with safe_open(str(checkpoint / "model.safetensors"), framework="pt") as f:
        names = list(f.keys())
    files[SHARD] = weights
    files["model.safetensors.index.json"] = json.dumps(
        {"metadata": {"total_size": len(weights)}, "weight_map": dict.fromkeys(names, SHARD)}
    ).encode()
    files["consolidated.safetensors"] = weights
    files["consolidated.safetensors.index.json"] = b"{}"
    files["pytorch_model.bin"] = b"\0" * 64
    return files


def failure(uri: str, root: pathlib.Path, **kw: object) -> DownloadError:
    with pytest.raises(DownloadError) as info:
        resolve_model(uri, root, **kw)
    assert "\n" not in str(info.value)
    return info.value


def test_hf_sharded_beside_consolidated_fetches_the_shards_only(
    hub: FakeHub, tmp_path: pathlib.Path, checkpoint: pathlib.Path
) -> None:
    from pagoda.runtime.model.loader import load_model

    hub.add("org/mistral", mistral_layout(checkpoint))
    path = pathlib.Path(resolve_model("hf://org/mistral", tmp_path))
    assert sorted(p.name for p in path.iterdir()) == SHARDED
    assert not any("consolidated" in r or ".bin" in r for r in hub.requests)
    assert load_model(str(path)).config.vocab_size == 64


def test_a_kimi_repo_fetches_its_tiktoken_files_and_no_other_code(
    hub: FakeHub, tmp_path: pathlib.Path, checkpoint: pathlib.Path
) -> None:
    files = {p.name: p.read_bytes() for p in checkpoint.iterdir() if p.is_file()}
    del files["tokenizer.json"]
    extra = ["tiktoken.model", "tokenization_kimi.py", "modeling_deepseek.py", "README.md"]
    hub.add("org/kimi", {**files, **{name: b"x" for name in extra}})
    path = pathlib.Path(resolve_model("hf://org/kimi", tmp_path))
    names = {p.name for p in path.iterdir()}
    assert {"tiktoken.model", "tokenization_kimi.py"} <= names
    assert not names & {"modeling_deepseek.py", "README.md"}


def test_gpt2_tokenizer_files_are_fetched_only_without_a_tokenizer_json(
    hub: FakeHub, tmp_path: pathlib.Path, checkpoint: pathlib.Path
) -> None:
    """OPT's repos: vocab.json + merges.txt and no tokenizer.json (`model/bpe_files.py`):
    fetched; beside a tokenizer.json (Qwen's): left on the hub."""
    files = {p.name: p.read_bytes() for p in checkpoint.iterdir() if p.is_file()}
    bpe = {"vocab.json": b"{}", "merges.txt": b"#version: 0.2\n"}
    hub.add("org/qwen-like", {**files, **bpe})
    names = {p.name for p in pathlib.Path(resolve_model("hf://org/qwen-like", tmp_path)).iterdir()}
    assert "tokenizer.json" in names and not names & set(bpe)
    del files["tokenizer.json"]
    hub.add("org/opt-like", {**files, **bpe})
    names = {p.name for p in pathlib.Path(resolve_model("hf://org/opt-like", tmp_path)).iterdir()}
    assert set(bpe) <= names and "tokenizer.json" not in names


def test_tokenizer_model_is_fetched_only_without_tokenizer_json(
    hub: FakeHub, tmp_path: pathlib.Path, checkpoint: pathlib.Path
) -> None:
    files = {p.name: p.read_bytes() for p in checkpoint.iterdir() if p.is_file()}
    hub.add("org/both", {**files, "tokenizer.model": b"x", "tokenization_x.py": b"x"})
    names = {p.name for p in pathlib.Path(resolve_model("hf://org/both", tmp_path)).iterdir()}
    assert "tokenizer.json" in names and not names & {"tokenizer.model", "tokenization_x.py"}
    del files["tokenizer.json"]
    hub.add("org/spm", {**files, "tokenizer.model": b"x"})
    names = {p.name for p in pathlib.Path(resolve_model("hf://org/spm", tmp_path)).iterdir()}
    assert "tokenizer.model" in names


def test_s3_sharded_beside_consolidated_fetches_the_shards_only(
    s3: MotoS3, tmp_path: pathlib.Path, checkpoint: pathlib.Path
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name, data in mistral_layout(checkpoint).items():
        (src / name).write_bytes(data)
    s3.upload_dir("models", "mistral", src)
    path = pathlib.Path(resolve_model("s3://models/mistral", tmp_path / "dl"))
    assert sorted(p.name for p in path.iterdir() if not p.name.startswith(".")) == SHARDED


def test_an_index_naming_a_missing_shard_is_not_found(
    hub: FakeHub, tmp_path: pathlib.Path, checkpoint: pathlib.Path
) -> None:
    files = mistral_layout(checkpoint)
    del files[SHARD]
    hub.add("org/broken", files)
    err = failure("hf://org/broken", tmp_path)
    assert err.detail == "NotFound" and SHARD in str(err), str(err)


def test_every_name_of_a_revision_is_found_offline(hub: FakeHub, tmp_path: pathlib.Path) -> None:
    path = resolve_model("hf://org/tiny", tmp_path)
    commit = hub.repos["org/tiny"].commit
    for uri in ("hf://org/tiny", "hf://org/tiny@main", f"hf://org/tiny@{commit}"):
        assert resolve_model(uri, tmp_path, offline=True) == path, uri
    with pytest.raises(DownloadError):  # another branch was never downloaded
        resolve_model("hf://org/tiny@dev", tmp_path, offline=True)
    # huggingface_hub's own offline mode finds the branch too (refs/main was recorded)
    from huggingface_hub import hf_hub_download

    found = hf_hub_download("org/tiny", "config.json", cache_dir=tmp_path, local_files_only=True)
    assert pathlib.Path(found).parent == pathlib.Path(path)


def test_a_snapshot_huggingface_hub_downloaded_is_found_offline(
    hub: FakeHub, tmp_path: pathlib.Path
) -> None:
    """`hf download org/tiny --cache-dir DIR` then `pagoda serve --model hf://org/tiny` offline."""
    from huggingface_hub import snapshot_download

    got = snapshot_download("org/tiny", cache_dir=tmp_path, endpoint=hub.endpoint)
    assert resolve_model("hf://org/tiny", tmp_path, offline=True) == got
    assert resolve_model("hf://org/tiny@main", tmp_path, offline=True) == got
    (pathlib.Path(got) / "model.safetensors").unlink()  # incomplete: not served
    assert failure("hf://org/tiny", tmp_path, offline=True).detail == "NotCached"


def test_gated_repo_with_and_without_a_token(
    hub: FakeHub, tmp_path: pathlib.Path, checkpoint: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub.add_dir("org/gated", checkpoint, gated=True)
    err = failure("hf://org/gated", tmp_path / "a")  # the token's account has no access yet
    assert err.detail == "Unauthorized" and "HTTP 403" in str(err) and "access" in str(err), err
    monkeypatch.delenv("HF_TOKEN")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "no-token-file"))
    err = failure("hf://org/gated", tmp_path / "b")
    assert err.detail == "Unauthorized" and "HF_TOKEN is not set" in str(err), err
    monkeypatch.setenv("HF_TOKEN", hub.token or "")
    hub.granted.add("org/gated")
    assert resolve_model("hf://org/gated", tmp_path / "c")


@pytest.mark.parametrize("source", ["hf", "s3"])
def test_processes_sharing_the_directory_download_one_at_a_time(
    request: pytest.FixtureRequest,
    tmp_path: pathlib.Path,
    caplog: pytest.LogCaptureFixture,
    source: str,
) -> None:
    """A second download of the model into the same directory (another pod on a shared claim:
    the same pid, often) waits for the lock the first holds, then finds the files there."""
    request.getfixturevalue("hub" if source == "hf" else "s3")
    uri = "hf://org/tiny" if source == "hf" else "s3://models/tiny"
    ref = parse_uri(uri)
    result: list[str] = []
    caplog.set_level(logging.INFO, "pagoda.runtime.model.sources")
    with cache.download_lock(tmp_path, ref):
        waiter = threading.Thread(target=lambda: result.append(resolve_model(uri, tmp_path)))
        waiter.start()
        waiter.join(1.0)
        assert waiter.is_alive() and not result  # waiting, nothing written meanwhile
        assert cache.lookup(tmp_path, ref) is None
    waiter.join(30)
    assert result and cache.lookup(tmp_path, ref) == pathlib.Path(result[0])
    assert "another process is downloading it" in caplog.text


@pytest.fixture
def read_only(tmp_path: pathlib.Path) -> pathlib.Path:
    """`tmp_path/ro`: a read-only view (bind mount) of `tmp_path/rw`; skipped where mounting is
    not allowed."""
    import subprocess

    rw, ro = tmp_path / "rw", tmp_path / "ro"
    rw.mkdir()
    ro.mkdir()
    done = subprocess.run(["mount", "--bind", str(rw), str(ro)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {done.stderr.decode().strip()[:200]}")
    subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], check=True)
    yield ro
    subprocess.run(["umount", "-l", str(ro)], capture_output=True)


@pytest.mark.filterwarnings("ignore")
def test_a_read_only_directory_serves_its_copy_online_and_refuses_downloads_in_one_line(
    hub: FakeHub, read_only: pathlib.Path
) -> None:
    """A cache mounted read-only (online, HF_HUB_OFFLINE unset): the complete copy is served after
    the one look at the revision; a model not there fails with one line naming the directory."""
    rw = read_only.parent / "rw"
    path = resolve_model("hf://org/tiny", rw)
    assert resolve_model("hf://org/tiny", read_only) == path.replace(str(rw), str(read_only))
    err = failure("hf://org/big", read_only)
    assert err.detail == "Failed" and "read-only" in str(err).lower(), str(err)


def test_a_download_dir_that_is_not_a_directory_is_named(
    hub: FakeHub, tmp_path: pathlib.Path
) -> None:
    (tmp_path / "file").write_text("")
    err = failure("hf://org/tiny", tmp_path / "file" / "models")
    assert err.detail == "Failed" and "cannot write to the download directory" in str(err), err
    assert str(tmp_path / "file" / "models") in str(err)


def test_a_gguf_repo_says_what_to_do(hub: FakeHub, tmp_path: pathlib.Path) -> None:
    hub.add("org/m-GGUF", {"README.md": b"#", "m.Q4_K_M.gguf": b"GGUF", "m.Q8_0.gguf": b"GGUF"})
    err = failure("hf://org/m-GGUF", tmp_path)
    assert err.detail == "NotFound" and "m.Q4_K_M.gguf" in str(err) and "path" in str(err), err


def test_what_a_killed_download_left_is_removed(hub: FakeHub, tmp_path: pathlib.Path) -> None:
    """huggingface_hub removes its temporary file when a download fails, not when the process
    is killed (an evicted pod): the next download, holding the repo's lock, removes it, so it
    neither fills the volume nor counts against the size limit."""
    blobs = tmp_path / "models--org--big" / "blobs"
    blobs.mkdir(parents=True)
    (blobs / "0123abcd.9f8e7d6c.incomplete").write_bytes(b"\0" * (200 << 10))
    assert resolve_model("hf://org/big", tmp_path, size_limit=450 << 10)
    assert not list(blobs.glob("*.incomplete"))


def pickled_layout(checkpoint: pathlib.Path) -> dict[str, bytes]:
    """The tiny checkpoint as older repos hold theirs: PyTorch pickles only, two shards named by
    pytorch_model.bin.index.json (transformers 4's save_pretrained), and a training_args.bin."""
    import io

    import torch
    from safetensors.torch import load_file

    files = {p.name: p.read_bytes() for p in checkpoint.iterdir() if p.is_file()}
    del files["model.safetensors"]
    state = load_file(str(checkpoint / "model.safetensors"))
    names = sorted(state)
    weight_map = {}
    for i, part in enumerate((names[::2], names[1::2]), 1):
        shard, buf = f"pytorch_model-{i:05d}-of-00002.bin", io.BytesIO()
        torch.save({n: state[n] for n in part}, buf)
        files[shard] = buf.getvalue()
        weight_map |= dict.fromkeys(part, shard)
    files["pytorch_model.bin.index.json"] = json.dumps(
        {"metadata": {}, "weight_map": weight_map}
    ).encode()
    files["training_args.bin"] = b"\0" * 64
    return files


@pytest.mark.parametrize("source", ["hf", "s3"])
def test_a_checkpoint_of_pickles_only_fetches_the_shards_its_index_names(
    request: pytest.FixtureRequest, tmp_path: pathlib.Path, checkpoint: pathlib.Path, source: str
) -> None:
    """config.json + pytorch_model-0000x-of-0000y.bin (older repos): the shards and their index
    are fetched (not training_args.bin) and load; beside safetensors they are not fetched
    (`test_hf_sharded_beside_consolidated_fetches_the_shards_only`)."""
    from pagoda.runtime.model.loader import load_model

    files = pickled_layout(checkpoint)
    if source == "hf":
        request.getfixturevalue("hub").add("org/bin-only", files)
        uri = "hf://org/bin-only"
    else:
        s3 = request.getfixturevalue("s3").client()
        for name, data in files.items():
            s3.put_object(Bucket="models", Key=f"bin-only/{name}", Body=data)
        uri = "s3://models/bin-only"
    path = pathlib.Path(resolve_model(uri, tmp_path))
    got = sorted(p.name for p in path.iterdir() if not p.name.startswith("."))
    assert got == sorted(set(files) - {"training_args.bin", "README.md"}), got
    assert load_model(str(path)).config.vocab_size == 64
    assert resolve_model(uri, tmp_path, offline=True) == str(path)
    if source == "hf":  # a snapshot huggingface_hub downloaded, found offline while complete
        from huggingface_hub import snapshot_download

        hub = request.getfixturevalue("hub")
        got = snapshot_download("org/bin-only", cache_dir=tmp_path / "hf", endpoint=hub.endpoint)
        assert resolve_model(uri, tmp_path / "hf", offline=True) == got
        (pathlib.Path(got) / "pytorch_model-00002-of-00002.bin").unlink()
        assert failure(uri, tmp_path / "hf", offline=True).detail == "NotCached"


def test_a_checkpoint_of_other_pickles_is_refused_naming_them(
    hub: FakeHub, tmp_path: pathlib.Path, checkpoint: pathlib.Path
) -> None:
    """config.json + model.pt (not a name transformers saves): NotFound naming it and what the
    engine reads."""
    files = {p.name: p.read_bytes() for p in checkpoint.iterdir() if p.is_file()}
    del files["model.safetensors"]
    files["model.pt"] = b"PK\3\4" + b"\0" * 60
    hub.add("org/pt-only", files)
    err = failure("hf://org/pt-only", tmp_path)
    assert err.detail == "NotFound", err
    assert "model.pt" in str(err) and "pytorch_model.bin" in str(err), err
