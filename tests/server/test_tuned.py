"""`pagoda serve --tuned-profile`: identity matching, flags over the profile's knobs, and the
profile's kernel configs first on the search path."""

from __future__ import annotations

import json
import logging

import pytest
from pagoda.kernels import config as kc
from pagoda.runtime.config import EngineConfig
from pagoda.runtime.server.tuned import (
    apply_tuned_profile,
    check_profile,
    describe,
    profile_engine_kwargs,
)
from pagoda.runtime.tuned_profile import ProfileError
from profile_testlib import make_profile

ENGINE_ARGS = {"dtype": "float32", "device": "cpu"}  # the scheduler flags were omitted


def test_mismatch_names_every_difference(tmp_path):
    make_profile(tmp_path, device="NVIDIA H200", dtype="bfloat16")
    with pytest.raises(ProfileError) as err:
        check_profile(str(tmp_path), model="smollm2-135m/", engine_kwargs=ENGINE_ARGS)
    msg = str(err.value)
    assert "device 'NVIDIA H200' (profile) != 'cpu: " in msg
    assert "dtype 'bfloat16' (profile) != 'float32' (this server)" in msg
    assert "model" not in msg.split("setup:")[1]  # a trailing slash names the same model
    assert "--tuned-profile-mismatch=warn" in msg


def test_mismatch_under_warn_serves_on_defaults(tmp_path, caplog):
    make_profile(tmp_path, model="other-model")
    with caplog.at_level(logging.WARNING, "pagoda.serve"):
        profile, args = apply_tuned_profile(
            str(tmp_path), model="smollm2-135m", engine_kwargs=ENGINE_ARGS,
            mismatch="warn",
        )  # fmt: skip
    assert profile is None and args == ENGINE_ARGS
    assert "model 'other-model' (profile) != 'smollm2-135m'" in caplog.text
    assert "serving on defaults" in caplog.text


def test_flags_override_the_profile():
    class P:
        def scheduler_args(self):
            return {"max_num_batched_tokens": 96, "max_num_seqs": 12}

    # left at their defaults: the profile's knobs apply
    assert profile_engine_kwargs(P(), ENGINE_ARGS) == {
        **ENGINE_ARGS, "max_num_seqs": 12, "max_num_batched_tokens": 96,
    }  # fmt: skip
    # an explicit flag wins even when it equals the engine's default (64)
    same_as_default = {**ENGINE_ARGS, "max_num_seqs": 64}
    assert profile_engine_kwargs(P(), same_as_default)["max_num_seqs"] == 64
    # set explicitly: the flag wins, and a batch larger than the tuned budget gets the budget
    explicit = {**ENGINE_ARGS, "max_num_seqs": 128}
    assert profile_engine_kwargs(P(), explicit) == {
        **explicit, "max_num_batched_tokens": 128,
    }  # fmt: skip
    # without chunked prefill the budget must cover max_model_len: the profile's is not used
    no_chunk = {**ENGINE_ARGS, "enable_chunked_prefill": False}
    assert "max_num_batched_tokens" not in profile_engine_kwargs(P(), no_chunk)


def test_apply_puts_the_profile_configs_first(tmp_path, monkeypatch):
    monkeypatch.setenv(kc.CONFIG_DIR_ENV, "/elsewhere")
    make_profile(tmp_path)
    kc.save_kernel_config(
        "rms_norm", {"hidden": 576}, {"num_warps": 2}, device="Tuned GPU", directory=tmp_path
    )
    profile, args = apply_tuned_profile(
        str(tmp_path), model="smollm2-135m", engine_kwargs=ENGINE_ARGS
    )
    try:
        assert profile is not None and profile.created == "2026-11-30T21:00:00Z"
        assert args["max_num_seqs"] == 12 and args["max_num_batched_tokens"] == 96
        EngineConfig.create("smollm2-135m", **args)  # a valid engine config
        assert kc.config_dirs() == (tmp_path,)
        assert kc._search_dirs() == [tmp_path, kc.Path("/elsewhere"), kc.PACKAGE_CONFIG_DIR]
        assert kc.get_kernel_config("rms_norm", {"hidden": 576}, "Tuned GPU")["num_warps"] == 2
        line = describe(profile, args)  # logged once every start-up check passed
        assert "tuned profile" in line and "max_num_seqs=12" in line
    finally:
        kc.set_config_dirs(())


def test_env_names_the_profile(tmp_path, monkeypatch):
    make_profile(tmp_path)
    monkeypatch.setenv("PAGODA_TUNED_PROFILE", str(tmp_path))
    try:
        profile, _ = apply_tuned_profile(None, model="smollm2-135m", engine_kwargs=ENGINE_ARGS)
    finally:
        kc.set_config_dirs(())
    assert profile is not None and json.loads((tmp_path / "profile.json").read_text())


def test_a_listed_archive_that_is_missing_is_one_line(tmp_path, caplog):
    from pagoda.runtime.server.tuned import kernel_cache_archive
    from pagoda.runtime.tuned_profile import KERNEL_CACHE_FILE, load_profile

    make_profile(tmp_path, kernel_cache={"status": "packed", "sha256": "a" * 64})
    with caplog.at_level(logging.INFO, "pagoda.serve"):
        assert kernel_cache_archive(load_profile(tmp_path)) is None
    assert f"the profile lists {KERNEL_CACHE_FILE} but" in caplog.text
    assert "its kernels compile at start" in caplog.text
    (tmp_path / KERNEL_CACHE_FILE).write_bytes(b"x")
    assert kernel_cache_archive(load_profile(tmp_path)) == (tmp_path / KERNEL_CACHE_FILE, "a" * 64)
    make_profile(tmp_path)  # a CPU profile: no section, nothing said
    (tmp_path / KERNEL_CACHE_FILE).unlink()
    caplog.clear()
    with caplog.at_level(logging.INFO, "pagoda.serve"):
        assert kernel_cache_archive(load_profile(tmp_path)) is None
    assert caplog.text == ""


def test_the_engine_factory_installs_the_profile_kernels_before_warm_up(
    tmp_path, monkeypatch, caplog
):
    """serve's factory (run in the engine process) with a profile that ships sm_90 kernels:
    they land in this process's TRITON_CACHE_DIR before the engine is built. This CPU compiles
    no GPU kernel, so the device's target is the one thing stood in for (an H200's)."""
    from hf_oracle import make_tiny_llama
    from kernel_cache_testlib import IDENTITY, cache_files, compile_scale
    from pagoda.runtime import kernel_cache
    from pagoda.runtime.server.launch import build_core
    from pagoda.runtime.server.tuned import kernel_cache_archive
    from pagoda.runtime.tuned_profile import KERNEL_CACHE_FILE, load_profile

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "tuning-job"))
    for block in (128, 256):
        compile_scale(block)
    packed = kernel_cache.pack(
        tmp_path / "tuning-job", tmp_path / "p" / KERNEL_CACHE_FILE, IDENTITY
    )
    model = tmp_path / "tiny"
    make_tiny_llama(model)
    make_profile(tmp_path / "p", model=str(model), kernel_cache=packed.section())
    shipped = kernel_cache_archive(load_profile(tmp_path / "p"))
    assert shipped == (packed.path, packed.sha256)

    pod = tmp_path / "pod-triton"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(pod))
    monkeypatch.setattr(kernel_cache, "target_of", lambda device: IDENTITY.target)
    cfg = EngineConfig.create(
        str(model), device="cpu", dtype="float32", max_model_len=128, kv_cache_memory=1 << 20
    )
    with caplog.at_level(logging.INFO):
        core = build_core(cfg, kernel_cache=shipped)
    core.close()
    assert len({name.split("/")[0] for name in cache_files(pod)}) == 2
    text = caplog.text
    assert (
        f"kernel cache: 2 kernels from the tuned profile (triton {IDENTITY.triton}, cuda 90)"
        in text
    )
    assert text.index("kernel cache: 2 kernels") < text.index("engine core built")
    assert "start compiled 0 Triton cache entries the profile did not ship" in text
    assert "warm-up: " in text  # with how long it took


SMOLLM2_SHAPES = {
    "hidden_size": 576, "intermediate_size": 1536, "num_heads": 9, "num_kv_heads": 3,
    "head_dim": 64, "vocab_size": 49152, "num_layers": 30, "num_experts": 0,
    "num_experts_per_tok": 0, "moe_intermediate_size": 0, "shared_expert_intermediate_size": 0,
    "num_moe_layers": 0, "quantization": "none", "mlp_matrices": 3,
}  # fmt: skip


def smollm2_shapes():
    from pagoda.runtime.model.shape_fingerprint import model_fingerprint

    return model_fingerprint("smollm2-135m", None)


def test_the_fingerprint_is_the_models_dimensions():
    assert smollm2_shapes() == SMOLLM2_SHAPES


@pytest.mark.parametrize("mismatch", ["error", "warn"])
def test_a_profile_for_other_shapes_is_refused(tmp_path, caplog, mismatch):
    """Another architecture behind the same --model (another commit, a replaced folder): the
    kernel configs were chosen for other shapes. Error: one line (serve exits 2); warn: the
    server runs on its defaults."""
    other = {**SMOLLM2_SHAPES, "num_layers": 24, "quantization": "fp8"}
    make_profile(tmp_path, shape_fingerprint=other, model_commit="a" * 40)
    with caplog.at_level(logging.WARNING, "pagoda.serve"):
        if mismatch == "error":
            with pytest.raises(ProfileError) as err:
                check_profile(str(tmp_path), model="smollm2-135m", engine_kwargs=ENGINE_ARGS,
                              shapes=smollm2_shapes)  # fmt: skip
            msg = str(err.value)
        else:
            profile, args = apply_tuned_profile(
                str(tmp_path), model="smollm2-135m", engine_kwargs=ENGINE_ARGS, mismatch="warn",
                shapes=smollm2_shapes,
            )  # fmt: skip
            assert profile is None and args == ENGINE_ARGS
            msg = caplog.text
    assert "num_layers 24 (profile) != 30 (this model)" in msg and "\n" not in msg.strip()
    assert "quantization 'fp8' (profile) != 'none' (this model)" in msg


def test_another_commit_with_the_same_shapes_is_used(tmp_path):
    make_profile(tmp_path, shape_fingerprint=SMOLLM2_SHAPES, model_commit="a" * 40)
    profile = check_profile(str(tmp_path), model="smollm2-135m", engine_kwargs=ENGINE_ARGS,
                            shapes=smollm2_shapes)  # fmt: skip
    assert profile is not None
    note = profile.commit_note("b" * 40, shapes_checked=True)
    assert (
        note and "this server reads commit bbbbbbbbbbbb: using it (same shape fingerprint" in note
    )
    assert profile.commit_note("a" * 40, shapes_checked=True) is None


def test_a_profile_without_a_fingerprint_keeps_working(tmp_path):
    """An older `pagoda tune` wrote none: the identity checks alone, and the old warning."""
    make_profile(tmp_path, model_commit="a" * 40)

    def never():
        raise AssertionError("nothing to compare the model's fingerprint with")

    profile = check_profile(str(tmp_path), model="smollm2-135m", engine_kwargs=ENGINE_ARGS,
                            shapes=never)  # fmt: skip
    assert profile is not None and profile.shape_fingerprint is None
    assert "has no shape fingerprint" in profile.commit_note("b" * 40, shapes_checked=True)


def test_a_tuner_recording_more_or_fewer_dimensions_is_compared_on_the_shared_ones(tmp_path):
    newer = {**SMOLLM2_SHAPES, "sliding_window": 4096}
    fewer = {k: SMOLLM2_SHAPES[k] for k in ("hidden_size", "num_layers")}
    for shapes in (newer, fewer):
        make_profile(tmp_path, shape_fingerprint=shapes)
        assert check_profile(str(tmp_path), model="smollm2-135m", engine_kwargs=ENGINE_ARGS,
                             shapes=smollm2_shapes) is not None  # fmt: skip
