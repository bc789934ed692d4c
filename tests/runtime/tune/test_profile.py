"""profile.json: validation, identity matching, and how `pagoda serve` applies a profile."""

from __future__ import annotations

import json
import logging
import os

import pytest
import torch
from pagoda.kernels import config as kc
from pagoda.runtime.config import EngineConfig
from pagoda.runtime.tune.profile import (
    SCHEMA_VERSION,
    ProfileError,
    device_identity,
    load_profile,
    write_profile,
)
from pagoda.runtime.tune.serving import apply_tuned_profile, check_profile, profile_engine_args

ENGINE_ARGS = {"dtype": "float32", "device": "cpu"}  # the scheduler flags were omitted


def make_profile(folder, **overrides):
    data = {
        "schema_version": SCHEMA_VERSION,
        "device": device_identity(torch.device("cpu")),
        "model": "smollm2-135m",
        "dtype": "float32",
        "created": "2026-11-30T21:00:00Z",
        "scheduler": {"max_num_batched_tokens": 96, "max_num_seqs": 12},
        "capacity": {"prefill_tokens_per_s": 500.0, "decode_tokens_per_s": 80.0},
        **overrides,
    }
    write_profile(folder, data)
    return folder


def test_load_reports_what_is_wrong(tmp_path):
    with pytest.raises(ProfileError, match="no such directory"):
        load_profile(tmp_path / "nope")
    with pytest.raises(ProfileError, match="run `pagoda tune` first"):
        load_profile(tmp_path)
    (tmp_path / "profile.json").write_text("{not json")
    with pytest.raises(ProfileError, match="cannot read JSON"):
        load_profile(tmp_path)
    make_profile(tmp_path, schema_version=99)
    with pytest.raises(ProfileError, match="schema_version 99"):
        load_profile(tmp_path)
    make_profile(tmp_path, device="")
    with pytest.raises(ProfileError, match="'device'"):
        load_profile(tmp_path)
    make_profile(tmp_path, scheduler={"max_num_seqs": 0})
    with pytest.raises(ProfileError, match=r"scheduler\.max_num_seqs"):
        load_profile(tmp_path)


def test_mismatch_names_every_difference(tmp_path):
    make_profile(tmp_path, device="NVIDIA H200", dtype="bfloat16")
    with pytest.raises(ProfileError) as err:
        check_profile(str(tmp_path), model="smollm2-135m/", engine_args=ENGINE_ARGS)
    msg = str(err.value)
    assert "device 'NVIDIA H200' (profile) != 'cpu: " in msg
    assert "dtype 'bfloat16' (profile) != 'float32' (this server)" in msg
    assert "model" not in msg.split("setup:")[1]  # a trailing slash names the same model
    assert "--tuned-profile-mismatch=warn" in msg


def test_mismatch_under_warn_serves_on_defaults(tmp_path, caplog):
    make_profile(tmp_path, model="other-model")
    with caplog.at_level(logging.WARNING, "pagoda.serve"):
        profile, args = apply_tuned_profile(
            str(tmp_path), model="smollm2-135m", engine_args=ENGINE_ARGS,
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
    assert profile_engine_args(P(), ENGINE_ARGS) == {
        **ENGINE_ARGS, "max_num_seqs": 12, "max_num_batched_tokens": 96,
    }  # fmt: skip
    # an explicit flag wins even when it equals the engine's default (64)
    same_as_default = {**ENGINE_ARGS, "max_num_seqs": 64}
    assert profile_engine_args(P(), same_as_default)["max_num_seqs"] == 64
    # set explicitly: the flag wins, and a batch larger than the tuned budget gets the budget
    explicit = {**ENGINE_ARGS, "max_num_seqs": 128}
    assert profile_engine_args(P(), explicit) == {
        **explicit, "max_num_batched_tokens": 128,
    }  # fmt: skip
    # without chunked prefill the budget must cover max_model_len: the profile's is not used
    no_chunk = {**ENGINE_ARGS, "enable_chunked_prefill": False}
    assert "max_num_batched_tokens" not in profile_engine_args(P(), no_chunk)


def test_apply_puts_the_profile_configs_first(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv(kc.CONFIG_DIR_ENV, "/elsewhere")
    make_profile(tmp_path)
    kc.save_kernel_config(
        "rms_norm", {"hidden": 576}, {"num_warps": 2}, device="Tuned GPU",
        directory=tmp_path / "configs",
    )  # fmt: skip
    with caplog.at_level(logging.INFO, "pagoda.serve"):
        profile, args = apply_tuned_profile(
            str(tmp_path), model="smollm2-135m", engine_args=ENGINE_ARGS
        )
    try:
        assert profile is not None and profile.created == "2026-11-30T21:00:00Z"
        assert args["max_num_seqs"] == 12 and args["max_num_batched_tokens"] == 96
        EngineConfig.create("smollm2-135m", **args)  # a valid engine config
        dirs = os.environ[kc.CONFIG_DIR_ENV].split(os.pathsep)
        assert dirs == [str(tmp_path / "configs"), str(tmp_path), "/elsewhere"]
        assert kc.get_kernel_config("rms_norm", {"hidden": 576}, "Tuned GPU")["num_warps"] == 2
        # a flat copy (ConfigMap volume: no sub-folders) is found as well
        kc.save_kernel_config(
            "rms_norm", {"hidden": 576}, {"num_warps": 8}, device="Flat GPU", directory=tmp_path
        )
        assert kc.get_kernel_config("rms_norm", {"hidden": 576}, "Flat GPU")["num_warps"] == 8
        assert "tuned profile" in caplog.text and "max_num_seqs=12" in caplog.text
    finally:
        kc.clear_config_cache()


def test_env_names_the_profile(tmp_path, monkeypatch):
    make_profile(tmp_path)
    monkeypatch.setenv("PAGODA_TUNED_PROFILE", str(tmp_path))
    monkeypatch.setenv(kc.CONFIG_DIR_ENV, "")
    profile, _ = apply_tuned_profile(None, model="smollm2-135m", engine_args=ENGINE_ARGS)
    kc.clear_config_cache()
    assert profile is not None and json.loads((tmp_path / "profile.json").read_text())
