"""`pagoda tune --revision` against a local Hub (HF_ENDPOINT): the commit the operator pinned is
measured whatever the branch says, recorded as profile.json's `model_commit`, and a server
reading another commit of the same model uses the profile with a warning. The errors are
`pagoda serve`'s and `pagoda download`'s (one line, exit 2, the termination message)."""

from __future__ import annotations

import json
import logging
import pathlib
from collections.abc import Iterator

import pytest
from hub_testlib import FakeHub, tiny_checkpoint
from pagoda.runtime.cli import main
from pagoda.runtime.model.sources.fetch import resolve_model

MOVED = "f" * 40  # where `main` points after a push the pin must not follow
TUNE = ["--dtype", "float32", "--max-model-len", "64", "--kv-cache-memory", "4MiB", "--quick",
        "--itl-target", "10", "--ttft-target", "60"]  # fmt: skip


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeHub]:
    with FakeHub() as h:
        h.add_dir("org/tiny", tiny_checkpoint(tmp_path_factory.mktemp("tiny")))
        yield h


@pytest.fixture
def env(hub: FakeHub, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    """HF_ENDPOINT at the local Hub, the download dir in tmp_path, `main` moved on."""
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("PAGODA_DOWNLOAD_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("PAGODA_TERMINATION_LOG", str(tmp_path / "termination"))
    monkeypatch.setitem(hub.repos["org/tiny"].branches, "main", MOVED)
    return tmp_path


@pytest.fixture(scope="module")
def tuned(hub: FakeHub, tmp_path_factory: pytest.TempPathFactory) -> Iterator[pathlib.Path]:
    """One tune of hf://org/tiny at its commit, as the operator's tuning Job runs it: the init
    container downloads the pinned commit into the volume, `pagoda tune --download-dir` reads
    it there offline."""
    root = tmp_path_factory.mktemp("job")
    commit = hub.repos["org/tiny"].commit
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_ENDPOINT", hub.endpoint)
        mp.setitem(hub.repos["org/tiny"].branches, "main", MOVED)
        mp.setenv("PAGODA_DOWNLOAD_DIR", str(root / "elsewhere"))  # --download-dir wins
        mp.setenv("PAGODA_TERMINATION_LOG", str(root / "termination"))
        mp.delenv("HF_HUB_OFFLINE", raising=False)
        cache = ["--download-dir", str(root / "models")]  # the operator's volume
        assert main(["download", "--model", "hf://org/tiny", "--revision", commit, *cache]) == 0
        mp.setenv("HF_HUB_OFFLINE", "1")
        out = root / "profile"
        code = main(["tune", "--model", "hf://org/tiny", "--revision", commit, *cache,
                     "--output", str(out), *TUNE])  # fmt: skip
        assert code == 0
        assert not (root / "elsewhere").exists()
    yield out


@pytest.mark.slow  # the tuned fixture: one --quick tune of the tiny model (~10 s)
def test_the_pinned_commit_is_measured_and_recorded(tuned: pathlib.Path, hub: FakeHub) -> None:
    profile = json.loads((tuned / "profile.json").read_text())
    assert profile["model"] == "hf://org/tiny"  # the identity serving checks: --model as written
    assert profile["model_commit"] == hub.repos["org/tiny"].commit
    assert profile["engine"]["prefill"] and profile["engine"]["decode"]
    assert profile["shape_fingerprint"] == {  # tiny_checkpoint's config.json
        "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "num_kv_heads": 1,
        "head_dim": 16, "vocab_size": 64, "num_layers": 1, "num_experts": 0,
        "num_experts_per_tok": 0, "moe_intermediate_size": 0,
        "shared_expert_intermediate_size": 0, "num_moe_layers": 0, "quantization": "none",
        "mlp_matrices": 3,
    }  # fmt: skip


@pytest.mark.slow
def test_a_server_on_another_commit_uses_the_profile_with_a_warning(
    tuned: pathlib.Path, env: pathlib.Path, hub: FakeHub, caplog: pytest.LogCaptureFixture
) -> None:
    """Weights of another commit of the same model have the same shapes: kernel configs and
    knobs still fit (as vLLM's tuned configs are keyed by shapes and device, not weights)."""
    from pagoda.runtime.server.tuned import apply_tuned_profile
    from pagoda.runtime.tuned_profile import load_profile

    profile = load_profile(tuned)
    assert profile.commit_note(hub.repos["org/tiny"].commit) is None
    assert profile.commit_note(None) is None  # a local copy, no commit known: nothing to say
    note = profile.commit_note("a" * 40)
    assert note and "measured on commit " + profile.model_commit[:12] in note
    assert "this server reads commit aaaaaaaaaaaa" in note
    applied, kwargs = apply_tuned_profile(
        str(tuned), model="hf://org/tiny", engine_kwargs={"dtype": "float32"}
    )
    assert (
        applied is not None and kwargs["max_num_seqs"] == profile.scheduler_args()["max_num_seqs"]
    )


@pytest.mark.slow
def test_a_bad_model_commit_is_refused(tuned: pathlib.Path, tmp_path: pathlib.Path) -> None:
    from pagoda.runtime.tuned_profile import ProfileError, load_profile

    data = json.loads((tuned / "profile.json").read_text())
    (tmp_path / "profile.json").write_text(json.dumps({**data, "model_commit": "main"}))
    with pytest.raises(ProfileError, match="'model_commit' must be a 40-hex-digit commit"):
        load_profile(tmp_path)


@pytest.mark.parametrize(
    ("argv", "needle", "reason"),
    [
        (["--model", "hf://org/tiny"], "revision 'main' not found", "ModelDownloadFailed/NotFound"),
        (["--model", "hf://org/tiny", "--revision", "a" * 40], "not found", "ModelDownloadFailed/NotFound"),
        (["--model", "hf://org/tiny", "--revision", "x..y"], "--revision: ", "InvalidModel"),
        (["--model", "s3://models/tiny", "--revision", "v1"], "only an hf:// model has revisions", "InvalidModel"),
        (["--model", "smollm2-135m", "--revision", "v1"], "only an hf:// model has revisions", "InvalidModel"),
    ],
)  # fmt: skip
def test_errors_are_one_line_and_exit_2(
    env: pathlib.Path, capsys: pytest.CaptureFixture, argv: list[str], needle: str, reason: str
) -> None:
    """Without --revision `main` is what is measured (here: a commit the Hub cannot serve)."""
    assert main(["tune", *argv, "--output", str(env / "out"), *TUNE]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("pagoda tune: error: ") and "\n" not in err and needle in err, err
    assert (env / "termination").read_text().startswith(reason + ": ")
    assert not (env / "out" / "profile.json").exists()


def test_offline_without_the_pin_finds_nothing(
    env: pathlib.Path, hub: FakeHub, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """What the tuning Job did before it got --revision: the init container fetched the pinned
    commit, and `pagoda tune` looked offline for the branch, which the cache does not name."""
    commit = hub.repos["org/tiny"].commit
    resolve_model("hf://org/tiny", revision=commit)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["tune", "--model", "hf://org/tiny", "--output", str(env / "out"), *TUNE]) == 2
    assert "ModelDownloadFailed/NotCached" in (env / "termination").read_text()
    capsys.readouterr()


def _measured_elsewhere(tuned: pathlib.Path, folder: str, **changes) -> pathlib.Path:
    """A copy of the profile as if measured on commit bbbb… (`changes`: to profile.json)."""
    profile = json.loads((tuned / "profile.json").read_text())
    moved = tuned.parent / folder
    moved.mkdir(exist_ok=True)
    for f in tuned.iterdir():
        (moved / f.name).write_bytes(f.read_bytes())
    changed = {**profile, "model_commit": "b" * 40, **changes}
    (moved / "profile.json").write_text(json.dumps({k: v for k, v in changed.items() if v}))
    return moved


@pytest.mark.slow
@pytest.mark.parametrize("fingerprint", [True, False])
def test_serve_logs_the_commit_note(
    tuned: pathlib.Path, env: pathlib.Path, hub: FakeHub, caplog: pytest.LogCaptureFixture,
    fingerprint: bool,
) -> None:  # fmt: skip
    """`pagoda serve --tuned-profile` on a copy of the model at another commit: the start-up
    check passes, with the note in the log: the same shape fingerprint (info), or none to
    compare, from an older tuner (a warning)."""
    from pagoda.runtime.server.config import ServerConfig
    from pagoda.runtime.server.launch import preflight

    moved = _measured_elsewhere(tuned, f"moved-{fingerprint}",
                                **({} if fingerprint else {"shape_fingerprint": None}))  # fmt: skip
    commit = hub.repos["org/tiny"].commit
    caplog.set_level(logging.INFO, "pagoda.serve")
    cfg = ServerConfig(model="hf://org/tiny")
    engine_cfg, applied = preflight(
        cfg, {"dtype": "float32", "max_model_len": 64, "kv_cache_memory": 4 << 20}, str(moved),
        revision=commit,
    )  # fmt: skip
    assert applied is not None and engine_cfg.model.endswith(f"/snapshots/{commit}")
    (note,) = [r for r in caplog.records if "measured on commit" in r.getMessage()]
    assert (
        f"measured on commit bbbbbbbbbbbb of hf://org/tiny, this server reads commit {commit[:12]}"
        in note.getMessage()
    )
    if fingerprint:
        assert note.levelno == logging.INFO and "same shape fingerprint" in note.getMessage()
    else:
        assert note.levelno == logging.WARNING and "no shape fingerprint" in note.getMessage()


@pytest.mark.slow
def test_another_commit_of_other_shapes_is_refused(
    tuned: pathlib.Path, env: pathlib.Path, hub: FakeHub, capsys: pytest.CaptureFixture
) -> None:
    """A commit that changed the architecture: serving refuses the profile in one line (exit 2
    from `pagoda serve`), and `pagoda tune` does not resume it (--force measures afresh)."""
    from pagoda.runtime.server.config import ServerConfig
    from pagoda.runtime.server.launch import preflight
    from pagoda.runtime.tuned_profile import ProfileError

    profile = json.loads((tuned / "profile.json").read_text())
    wider = {**profile["shape_fingerprint"], "hidden_size": 64}
    moved = _measured_elsewhere(tuned, "wider", shape_fingerprint=wider)
    commit = hub.repos["org/tiny"].commit
    with pytest.raises(ProfileError, match=r"hidden_size 64 \(profile\) != 32 \(this model\)"):
        preflight(ServerConfig(model="hf://org/tiny"), {"dtype": "float32", "max_model_len": 64},
                  str(moved), revision=commit)  # fmt: skip
    resolve_model("hf://org/tiny", revision=commit)
    code = main(["tune", "--model", "hf://org/tiny", "--revision", commit, "--output", str(moved),
                 *TUNE])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "was tuned for other model shapes (hidden_size 64" in err, err
