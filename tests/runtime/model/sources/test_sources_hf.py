"""hf:// through huggingface_hub against a local Hub (HF_ENDPOINT): the download, the cache found
again offline, and each failure class (no internet anywhere)."""

from __future__ import annotations

import json
import pathlib

import pytest
from hub_testlib import FakeHub
from pagoda.runtime.model.sources import cache
from pagoda.runtime.model.sources.errors import DownloadError
from pagoda.runtime.model.sources.fetch import resolve_model
from pagoda.runtime.model.sources.uri import S3URI, HfURI, is_remote, parse_uri

ENGINE_FILES = [
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
]


def failure(uri: str, root: pathlib.Path, **kw: object) -> DownloadError:
    with pytest.raises(DownloadError) as info:
        resolve_model(uri, root, **kw)
    assert info.value.reason == "ModelDownloadFailed"
    assert "\n" not in str(info.value)
    return info.value


@pytest.mark.parametrize(
    ("uri", "parsed"),
    [
        ("hf://Qwen/Qwen3-0.6B", HfURI("Qwen/Qwen3-0.6B")),
        ("hf://meta-llama/Llama-3.2-1B@v1.0", HfURI("meta-llama/Llama-3.2-1B", "v1.0")),
        ("hf://org/m@refs/pr/1", HfURI("org/m", "refs/pr/1")),
        ("s3://models/llama/3b/", S3URI("models", "llama/3b")),
        ("s3://my.bucket", S3URI("my.bucket", "")),
    ],
)
def test_uri_grammar(uri: str, parsed: object) -> None:
    assert is_remote(uri)
    assert parse_uri(uri) == parsed


@pytest.mark.parametrize(
    "uri",
    ["hf://noslash", "hf://a/b/c", "hf://org/../x", "hf://org/m@", "hf://org/m@a..b",
     "s3://A_B/x", "s3://ab", "s3://bucket/../x", "pvc://x/y"],
)  # fmt: skip
def test_bad_uris_are_refused(uri: str) -> None:
    with pytest.raises(ValueError):
        parse_uri(uri)


def test_download_keeps_only_what_the_engine_reads_then_works_offline(
    hub: FakeHub, tmp_path: pathlib.Path, checkpoint: pathlib.Path
) -> None:
    path = pathlib.Path(resolve_model("hf://org/tiny", tmp_path))
    commit = hub.repos["org/tiny"].commit
    assert path == tmp_path / "models--org--tiny" / "snapshots" / commit
    assert sorted(p.name for p in path.iterdir()) == ENGINE_FILES  # no README.md, no original/
    for name in ENGINE_FILES:
        assert (path / name).read_bytes() == (checkpoint / name).read_bytes()
    manifest = json.loads(cache.manifest_path(tmp_path, parse_uri("hf://org/tiny")).read_text())
    assert manifest["commit"] == commit and sorted(manifest["files"]) == ENGINE_FILES

    hub.requests.clear()
    assert resolve_model("hf://org/tiny", tmp_path, offline=True) == str(path)
    assert resolve_model(f"hf://org/tiny@{commit}", tmp_path) != ""  # fetched once for the sha
    hub.requests.clear()
    assert resolve_model(f"hf://org/tiny@{commit}", tmp_path) == str(path)
    assert hub.requests == []  # a commit revision complete in the cache: no request at all
    again = resolve_model("hf://org/tiny", tmp_path)  # online: one look at the revision
    assert again == str(path)
    assert not any("/resolve/" in r for r in hub.requests)  # and nothing downloaded again

    (path / "model.safetensors").unlink()  # a damaged cache is not "complete"
    assert failure("hf://org/tiny", tmp_path, offline=True).detail == "NotCached"


def test_the_loader_takes_the_uri_itself(
    hub: FakeHub, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`load_model("hf://...")` (LLM(...), pagoda tune) finds the copy in $PAGODA_DOWNLOAD_DIR."""
    from pagoda.runtime.model.loader import load_model

    resolve_model("hf://org/tiny", tmp_path)
    monkeypatch.setenv("PAGODA_DOWNLOAD_DIR", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    loaded = load_model("hf://org/tiny")
    assert (loaded.config.vocab_size, loaded.config.num_layers) == (64, 1)
    assert loaded.tokenizer.encode("w5 w6") == [5, 6]


ADAPTER = {"adapter_config.json": b'{"peft_type": "LORA", "r": 8, "lora_alpha": 16}',
           "adapter_model.safetensors": b"\0" * 64, "README.md": b"# a LoRA adapter\n"}  # fmt: skip


def test_a_lora_adapter_repo(hub: FakeHub, tmp_path: pathlib.Path) -> None:
    """A PEFT adapter (adapter_config.json + adapter_model.safetensors, no config.json), as the
    operator's adapter-download init container fetches it: downloaded, then found offline (by
    its manifest, or in a snapshot huggingface_hub put there); its weights as a pickle only are
    NotFound (the lora package reads safetensors)."""
    hub.add("org/lora", ADAPTER)
    path = pathlib.Path(resolve_model("hf://org/lora", tmp_path))
    assert path == tmp_path / "models--org--lora" / "snapshots" / hub.repos["org/lora"].commit
    assert sorted(p.name for p in path.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]  # fmt: skip
    assert resolve_model("hf://org/lora", tmp_path, offline=True) == str(path)
    hub.add("org/lora-bin", {"adapter_config.json": b"{}", "adapter_model.bin": b"pickle"})
    err = failure("hf://org/lora-bin", tmp_path)
    assert err.detail == "NotFound" and "but no adapter_model.safetensors" in str(err), err
    assert "found: adapter_model.bin" in str(err)

    commit = "c" * 40  # a snapshot huggingface_hub downloaded itself (no manifest)
    snapshot = tmp_path / "hf-cli" / "models--org--cli" / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        (snapshot / name).write_bytes(ADAPTER[name])
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text(commit)
    found = resolve_model("hf://org/cli", tmp_path / "hf-cli", offline=True)
    assert found == str(snapshot)


@pytest.mark.parametrize(
    ("uri", "detail", "words"),
    [
        ("hf://org/missing", "NotFound", "repository org/missing not found"),
        ("hf://org/tiny@v9", "NotFound", "revision 'v9' not found"),
        ("hf://org/readme-only", "NotFound", "no config.json"),
    ],
)
def test_not_found(hub: FakeHub, tmp_path: pathlib.Path, uri: str, detail: str, words: str) -> None:
    err = failure(uri, tmp_path)
    assert err.detail == detail and words in str(err), str(err)


def test_unauthorized(
    hub: FakeHub, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert resolve_model("hf://org/private", tmp_path)  # the right token
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    err = failure("hf://org/tiny", tmp_path / "b")
    assert err.detail == "Unauthorized" and "HTTP 401" in str(err) and "HF_TOKEN" in str(err)
    monkeypatch.delenv("HF_TOKEN")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "no-token-file"))
    err = failure("hf://org/private", tmp_path / "c")
    assert err.detail == "Unauthorized" and "private" in str(err)
    hub.other_tokens.add("hf_other_account")  # valid, but its account cannot see the repo: 404
    monkeypatch.setenv("HF_TOKEN", "hf_other_account")
    err = failure("hf://org/private", tmp_path / "d")
    assert err.detail == "NotFound" and "private and HF_TOKEN's account" in str(err), err


def test_a_token_from_a_file_with_its_newline_works_and_a_bad_one_is_never_shown(
    hub: FakeHub, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Secret made with `--from-file` keeps the file's newline: huggingface_hub's own token
    reading drops it. A token no header can carry is Unauthorized naming HF_TOKEN, and the
    message (a pod's log, the InferenceService's condition) never holds the token."""
    monkeypatch.setenv("HF_TOKEN", f" {hub.token}\r\n")
    assert resolve_model("hf://org/private", tmp_path / "a")
    monkeypatch.setenv("HF_TOKEN", "hf_sec\x0bret_value")
    err = failure("hf://org/private", tmp_path / "b")
    assert err.detail == "Unauthorized" and "HF_TOKEN cannot be sent" in str(err), err
    assert "ret_value" not in str(err)


def test_out_of_space_is_refused_before_a_byte_is_written(
    hub: FakeHub, tmp_path: pathlib.Path
) -> None:
    err = failure("hf://org/big", tmp_path, size_limit=200 << 10)
    assert err.detail == "OutOfSpace" and "size limit" in str(err), str(err)
    assert cache.disk_usage(tmp_path) == 0
    assert not any("/resolve/" in r for r in hub.requests)


def test_a_new_commit_needs_room_only_for_the_files_it_changed(
    hub: FakeHub, tmp_path: pathlib.Path
) -> None:
    """A commit to main that changes no weights (a README, a config): the blobs the snapshots
    share are linked, not downloaded, so a volume with room for one copy keeps serving it (the
    operator's init container runs this at every pod start)."""
    first = resolve_model("hf://org/big", tmp_path, size_limit=450 << 10)
    files = dict(hub.repos["org/big"].files)
    files["README.md"] = b"# updated\n"
    files["generation_config.json"] = b'{"do_sample": false}'
    hub.add("org/big", files)
    hub.requests.clear()
    second = resolve_model("hf://org/big", tmp_path, size_limit=450 << 10)
    assert second != first and hub.repos["org/big"].commit in second
    got = [r for r in hub.requests if r.startswith("GET") and "/resolve/" in r]
    assert [r.rpartition("/")[2] for r in got] == ["generation_config.json"], got


def test_revision_fetches_the_pinned_commit_whatever_the_branch_says(
    hub: FakeHub, tmp_path: pathlib.Path
) -> None:
    """`--revision COMMIT` (the operator's pin of an hf:// branch): that commit is fetched
    after the branch moved on, and found again offline and without a request; an s3:// model
    has no revisions."""
    from pagoda.runtime.termination import ReasonedError

    commit = hub.repos["org/tiny"].commit
    hub.repos["org/tiny"].branches["main"] = "f" * 40  # pushed to since the pin
    path = resolve_model("hf://org/tiny", tmp_path, revision=commit)
    assert pathlib.Path(path) == tmp_path / "models--org--tiny" / "snapshots" / commit
    assert resolve_model("hf://org/tiny", tmp_path, offline=True, revision=commit) == path
    hub.requests.clear()
    assert resolve_model("hf://org/tiny", tmp_path, revision=commit) == path
    assert hub.requests == []
    assert failure("hf://org/tiny", tmp_path, revision="a" * 40).detail == "NotFound"
    with pytest.raises(ReasonedError, match="only an hf:// model has revisions"):
        resolve_model("s3://models/tiny", tmp_path, revision=commit)


@pytest.mark.filterwarnings("ignore:Not enough free disk space")
def test_a_full_disk(hub: FakeHub, small_disk: pathlib.Path) -> None:
    """On a real 192 KiB filesystem: the listed sizes are checked against its free space; and when
    the listing understates them, the write fails with ENOSPC and is classified the same way."""
    err = failure("hf://org/big", small_disk)
    assert err.detail == "OutOfSpace" and "free in" in str(err), str(err)
    hub.understate_sizes = True
    err = failure("hf://org/big", small_disk)
    assert err.detail == "OutOfSpace" and "full" in str(err), str(err)
    assert cache.lookup(small_disk, parse_uri("hf://org/big")) is None
    commit = hub.repos["org/big"].commit  # the snapshot holds some files: not served either
    assert cache.lookup(small_disk, parse_uri(f"hf://org/big@{commit}")) is None
    assert not list(small_disk.rglob("*.incomplete"))  # partial files are not left behind
    assert resolve_model("hf://org/tiny", small_disk)  # so the small model still fits


def test_unreachable_falls_back_to_the_cache(
    hub: FakeHub, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = resolve_model("hf://org/tiny", tmp_path)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: nothing listens
    assert resolve_model("hf://org/tiny", tmp_path) == path
    err = failure("hf://org/private", tmp_path / "empty")
    assert err.detail == "Unreachable" and "127.0.0.1:9" in str(err)


def test_offline_from_the_environment(hub: FakeHub, tmp_path: pathlib.Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    err = failure("hf://org/tiny", tmp_path)
    assert err.detail == "NotCached" and "pagoda download --model hf://org/tiny" in str(err)
    assert hub.requests == []
