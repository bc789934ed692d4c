"""The tuned profile's format: validation, and the one folder layout (disk = ConfigMap)."""

from __future__ import annotations

import json

import pytest
from pagoda.kernels import config as kc
from pagoda.runtime.tuned_profile import ProfileError, load_profile, profile_files, remove_profile
from profile_testlib import make_profile


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


def test_the_folder_is_the_config_map(tmp_path):
    """Every file of the folder is a ConfigMap key as it is (no sub-folders)."""
    make_profile(tmp_path)
    kc.save_kernel_config("rms_norm", {"hidden": 576}, {"num_warps": 2}, device="Tuned GPU",
                          directory=tmp_path)  # fmt: skip
    (tmp_path / ".tmp-half-written.json").write_text("{")  # a write in progress is not sent
    files = profile_files(tmp_path)
    assert sorted(files) == ["Tuned_GPU.json", "profile.json"]
    assert json.loads(files["Tuned_GPU.json"])["kernels"]["rms_norm"]
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ProfileError, match=r"broken\.json"):
        profile_files(tmp_path)
    remove_profile(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tmp-half-written.json"]


def test_the_old_layout_is_refused_with_what_to_do(tmp_path):
    make_profile(tmp_path)
    kc.save_kernel_config("rms_norm", {"hidden": 576}, {"num_warps": 2}, device="Tuned GPU",
                          directory=tmp_path / "configs")  # fmt: skip
    with pytest.raises(ProfileError, match="move them up into"):
        load_profile(tmp_path)
    remove_profile(tmp_path)  # `pagoda tune --force`
    assert not (tmp_path / "configs").exists()
