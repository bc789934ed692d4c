"""`pagoda publish-profile` with a kernel cache: the archive goes in the ConfigMap's
``binaryData`` (base64) when the whole fits a ConfigMap, and is left out with one line when it
would not (the profile is still published); against the API-server emulator."""

from __future__ import annotations

import base64
import json
import os
import pathlib

from pagoda.operator.autotune import profiles, publish
from pagoda.runtime.tuned_profile import KERNEL_CACHE_FILE, MAX_BYTES, SCHEMA_VERSION, write_profile

NAME = "tuned-h200"


def profile_dir(folder: pathlib.Path, archive: bytes | None) -> pathlib.Path:
    write_profile(folder, {"schema_version": SCHEMA_VERSION, "device": "NVIDIA H200",
                           "model": "m", "dtype": "bfloat16", "created": "2026-12-01T00:00:00Z"})  # fmt: skip
    (folder / "NVIDIA_H200.json").write_text(json.dumps({"device": "NVIDIA H200", "kernels": {}}))
    if archive is not None:
        (folder / KERNEL_CACHE_FILE).write_bytes(archive)
    return folder


def test_the_archive_is_binary_data_when_it_fits(tmp_path):
    archive = os.urandom(300 * 1024)  # incompressible, as compressed cubins are
    folder = profile_dir(tmp_path, archive)
    data = publish.profile_data(folder)
    assert sorted(data) == ["NVIDIA_H200.json", "profile.json"]  # text keys only
    binary, note = publish.binary_data(folder, data)
    assert note is None and base64.b64decode(binary[KERNEL_CACHE_FILE]) == archive


def test_an_archive_over_the_limit_is_left_out_with_one_line(tmp_path):
    folder = profile_dir(tmp_path, os.urandom(700 * 1024))  # 933 KiB in base64
    binary, note = publish.binary_data(folder, publish.profile_data(folder))
    assert binary == {}
    assert note.startswith(f"kernel cache {KERNEL_CACHE_FILE} left out: the profile with it is ")
    assert f"at most {MAX_BYTES}" in note and "serving compiles its kernels" in note
    assert publish.binary_data(profile_dir(tmp_path / "none", None), {}) == ({}, None)


async def test_publish_writes_then_removes_the_archive(tmp_path, kube, capsys):
    await kube.create({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": NAME, "namespace": "default",
                     "annotations": {profiles.KEY_ANNOTATION: "{}"}},
        "data": {},
    })  # fmt: skip
    archive = os.urandom(100 * 1024)
    await publish._main(str(profile_dir(tmp_path / "a", archive)), f"default/{NAME}")
    got = await kube.get("ConfigMap", "default", NAME)
    assert sorted(got["data"]) == ["NVIDIA_H200.json", "profile.json"]
    assert base64.b64decode(got["binaryData"][KERNEL_CACHE_FILE]) == archive
    assert f"published 3 files to ConfigMap default/{NAME}" in capsys.readouterr().out

    # the next profile's archive does not fit: the stale one must not stay beside it
    await publish._main(str(profile_dir(tmp_path / "b", os.urandom(800 * 1024))), f"default/{NAME}")
    got = await kube.get("ConfigMap", "default", NAME)
    assert KERNEL_CACHE_FILE not in (got.get("binaryData") or {})
    out = capsys.readouterr()
    assert "left out" in out.err and f"published 2 files to ConfigMap default/{NAME}" in out.out
