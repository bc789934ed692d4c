"""`pagoda tune`'s kernel-cache stage: what it packs into the profile from a real Triton cache
(sm_90 kernels compiled here), when it is skipped, and its fresh process (on this CPU: the same
engine build and warm-up as `pagoda serve --tuned-profile`, writing Triton's cache where told).
The CUDA warm-up itself, and so the kernels it ships, needs a GPU: benchmarks/gpu_check.sh."""

from __future__ import annotations

import json

import pytest
import torch
from kernel_cache_testlib import IDENTITY, compile_scale
from pagoda.runtime import kernel_cache as kc
from pagoda.runtime.tune import kernel_cache_stage as stage
from pagoda.runtime.tuned_profile import KERNEL_CACHE_FILE, load_profile, profile_files
from profile_testlib import make_profile


def test_ship_packs_the_cache_and_the_profile_describes_it(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    for block in (64, 128, 256):
        compile_scale(block)
    out = make_profile(tmp_path / "profile")
    section = stage.ship(tmp_path / "triton", out, IDENTITY)
    archive = out / KERNEL_CACHE_FILE
    assert section["status"] == "packed" and section["file"] == KERNEL_CACHE_FILE
    assert (section["kernels"], section["entries"]) == (3, 3)
    assert section["bytes"] == archive.stat().st_size < section["unpacked_bytes"]
    assert (section["triton"], section["target"]) == (IDENTITY.triton, "cuda:90")
    assert stage.describe(section).startswith("3 kernels (3 cache entries), ")
    make_profile(out, kernel_cache=section)  # profile.json records it; still schema 1, valid
    profile = load_profile(out)
    assert profile.kernel_cache()["sha256"] == section["sha256"]
    assert KERNEL_CACHE_FILE not in profile_files(out)  # binary: publish adds it (binaryData)
    assert kc.install(archive, tmp_path / "pod", IDENTITY, section["sha256"]).kernels == 3


def test_nothing_compiled_ships_nothing(tmp_path):
    out = make_profile(tmp_path / "profile")
    (out / KERNEL_CACHE_FILE).write_bytes(b"an older profile's")
    section = stage.ship(tmp_path / "empty", out, IDENTITY)
    assert section == {
        "status": "skipped",
        "note": f"{tmp_path / 'empty'}: no compiled kernel to pack",
    }
    assert not (out / KERNEL_CACHE_FILE).exists()


def test_skipped_off_cuda_or_without_triton_attention():
    assert stage.cache_target(torch.device("cpu"), "torch") == (None, stage.CPU_SKIP)
    assert stage.cache_target(torch.device("cpu"), "triton") == (None, stage.CPU_SKIP)
    identity, note = stage.cache_target(torch.device("cuda"), "torch")
    assert identity is None and "torch attention backend" in note


def test_a_bad_kernel_cache_field_is_refused(tmp_path):
    from pagoda.runtime.tuned_profile import ProfileError

    make_profile(tmp_path, kernel_cache={"status": "packed", "sha256": "not-a-digest"})
    with pytest.raises(ProfileError, match=r"kernel_cache\.sha256 must be 64 hex digits"):
        load_profile(tmp_path)
    make_profile(tmp_path, kernel_cache=["a list"])
    with pytest.raises(ProfileError, match="'kernel_cache' must be an object"):
        load_profile(tmp_path)


def test_the_fresh_process_builds_and_warms_up_as_serve_would(tmp_path):
    """On this CPU nothing compiles, but the process is the one the GPU runs: the profile's
    knobs applied, serve's factory and warm-up, Triton's cache where it was told. An hf://
    model: the profile is checked against the URI, the engine reads the copy the tune measured
    (`model_path`; no download in the fresh process, which would find another commit)."""
    from hf_oracle import make_tiny_llama

    model = tmp_path / "tiny"
    make_tiny_llama(model)
    out = make_profile(tmp_path / "profile", model="hf://org/tiny")
    cache = tmp_path / "triton"
    args = {"device": "cpu", "dtype": "float32", "max_model_len": 128, "kv_cache_memory": 1 << 20}
    log = stage.warm_in_fresh_process(out, "hf://org/tiny", args, cache, 240, str(model))
    assert f"kernel cache: warming up into {cache}" in log
    assert "max_num_seqs=12 max_num_batched_tokens=96" in log  # the profile's knobs
    assert "engine core built" in log and "warm-up: 0 attention launches" in log
    section = stage.ship(cache, out, IDENTITY)
    assert section["status"] == "skipped"  # the torch backend on a CPU compiles nothing

    bad = json.dumps({**args, "max_model_len": 10**9})
    with pytest.raises(kc.KernelCacheError, match="the warm-up process exited 1"):
        stage.warm_in_fresh_process(out, "hf://org/tiny", json.loads(bad), cache, 240, str(model))
