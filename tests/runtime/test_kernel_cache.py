"""`pagoda.runtime.kernel_cache`: Triton's cache packed on one machine, installed on another, and
then a cache hit, with real sm_90 kernels compiled here (Triton's wheel brings ptxas); every bad
archive (another Triton or GPU, corrupt, truncated, hostile) is skipped with one warning."""

from __future__ import annotations

import io
import json
import logging
import shutil
import tarfile

import pytest
from kernel_cache_testlib import IDENTITY, cache_files, compile_scale
from pagoda.runtime import kernel_cache as kc


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Two variants of one kernel compiled once for the module (a fresh process each, ~3 s);
    (the Triton cache folder they went into, the kernels)."""
    cache = tmp_path_factory.mktemp("kernel_cache") / "built"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_CACHE_DIR", str(cache))
        kernels = [compile_scale(block)[0] for block in (128, 256)]
    return cache, kernels


@pytest.fixture
def compiled(built, tmp_path, monkeypatch):
    """This test's own copy of the module's Triton cache (tests add files to it), as if compiled
    there (the groups list their files by absolute path); (its folder, the kernels)."""
    cache = tmp_path / "built"
    shutil.copytree(built[0], cache)
    for grp in cache.glob("*/__grp__*.json"):
        grp.write_text(grp.read_text().replace(str(built[0]) + "/", str(cache) + "/"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    return cache, built[1]


def test_round_trip_into_another_directory_is_a_cache_hit(compiled, tmp_path, monkeypatch, caplog):
    built, kernels = compiled
    packed = kc.pack(built, tmp_path / "profile" / "triton-cache.tar.xz", IDENTITY)
    assert (packed.kernels, packed.entries) == (2, 2) and packed.bytes == packed.path.stat().st_size
    assert packed.section()["target"] == "cuda:90" and len(packed.section()["sha256"]) == 64

    served = tmp_path / "pod" / ".triton"  # another machine's cache: absolute paths differ
    done = kc.install(packed.path, served, IDENTITY, sha256=packed.sha256)
    assert done is not None and (done.kernels, done.files_written) == (2, 6)
    assert (
        done.describe() == f"2 kernels from the tuned profile (triton {IDENTITY.triton}, cuda 90)"
    )
    installed = cache_files(served)
    # pruned: metadata, binary and the group; no IR (ttir, ttgir, llir, ptx, source)
    assert {name.split("/")[1].split(".", 1)[1] for name in installed} == {"json", "cubin"}
    for grp in served.glob("*/__grp__*.json"):
        paths = json.loads(grp.read_text())["child_paths"].values()
        assert all(p.startswith(str(served / grp.parent.name) + "/") for p in paths)

    monkeypatch.setenv("TRITON_CACHE_DIR", str(served))
    for block, kernel in zip((128, 256), kernels, strict=True):
        hit, _ = compile_scale(block)
        assert hit.hash == kernel.hash and hit.asm["cubin"] == kernel.asm["cubin"]
    assert cache_files(served) == installed  # nothing compiled, nothing written
    compile_scale(512)  # a variant the archive lacks is compiled as before
    assert len(cache_files(served)) > len(installed)


def test_installing_twice_writes_nothing_new(compiled, tmp_path):
    packed = kc.pack(compiled[0], tmp_path / "a.tar.xz", IDENTITY)
    assert kc.install(packed.path, tmp_path / "c", IDENTITY).files_written == 6
    assert kc.install(packed.path, tmp_path / "c", IDENTITY).files_written == 0


@pytest.mark.parametrize(
    "field, value",
    [("triton", "2.0.0"), ("target", "cuda:80"), ("pagoda", "0.0.1")],
)
def test_another_setup_is_skipped_with_one_warning(compiled, tmp_path, caplog, field, value):
    import dataclasses

    packed = kc.pack(compiled[0], tmp_path / "a.tar.xz", IDENTITY)
    here = dataclasses.replace(IDENTITY, **{field: value})
    with caplog.at_level(logging.WARNING, "pagoda.runtime.kernel_cache"):
        assert kc.install(packed.path, tmp_path / "c", here) is None
    assert len(caplog.records) == 1 and "built for another setup" in caplog.text
    assert f"{field} " in caplog.text and "kernels compile at start" in caplog.text
    assert cache_files(tmp_path / "c") == {}


def _broken(path, how):
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "garbage":
        path.write_bytes(b"\xfd7zXZ\x00" + bytes(range(256)) * 4)
    elif how == "empty":
        path.write_bytes(b"")
    return path


@pytest.mark.parametrize("how", ["truncated", "garbage", "empty", "digest", "missing"])
def test_a_corrupt_archive_is_skipped_with_one_warning(compiled, tmp_path, caplog, how):
    packed = kc.pack(compiled[0], tmp_path / "a.tar.xz", IDENTITY)
    digest = "0" * 64 if how == "digest" else None
    if how == "missing":
        packed.path.unlink()
    else:
        _broken(packed.path, how)
    with caplog.at_level(logging.WARNING, "pagoda.runtime.kernel_cache"):
        assert kc.install(packed.path, tmp_path / "c", IDENTITY, sha256=digest) is None
    assert len(caplog.records) == 1 and "skipped" in caplog.text
    assert not list((tmp_path / "c").glob("*/*"))  # nothing half-installed


def _hostile(path, member: tarfile.TarInfo, listed: dict, data: bytes = b"x") -> None:
    manifest = {"format": kc.FORMAT, "identity": vars(IDENTITY).copy(), "entries": listed}
    with tarfile.open(path, "w:xz") as tar:
        raw = json.dumps(manifest).encode()
        info = tarfile.TarInfo(kc.MANIFEST)
        info.size = len(raw)
        tar.addfile(info, io.BytesIO(raw))
        if member.isfile():
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
        else:
            tar.addfile(member)


@pytest.mark.parametrize(
    "name, kind",
    [
        ("../../evil.json", tarfile.REGTYPE),
        ("abcdef0123456789/../../../evil.json", tarfile.REGTYPE),
        ("/tmp/evil.json", tarfile.REGTYPE),
        ("abcdef0123456789/link.json", tarfile.SYMTYPE),
        ("abcdef0123456789/unlisted.json", tarfile.REGTYPE),
    ],
)
def test_a_hostile_member_refuses_the_whole_archive(tmp_path, caplog, name, kind):
    member = tarfile.TarInfo(name)
    member.type = kind
    member.linkname = "/etc/passwd" if kind == tarfile.SYMTYPE else ""
    entry, _, file = name.partition("/")
    listed = {entry: [] if "unlisted" in name else [file]}
    _hostile(tmp_path / "bad.tar.xz", member, listed)
    with caplog.at_level(logging.WARNING, "pagoda.runtime.kernel_cache"):
        assert kc.install(tmp_path / "bad.tar.xz", tmp_path / "root" / "c", IDENTITY) is None
    assert "is not a cache file the manifest lists" in caplog.text
    assert [p.name for p in (tmp_path / "root").rglob("*")] == ["c"]  # nothing extracted
    assert not (tmp_path / "evil.json").exists()


def test_nothing_to_pack_is_an_error(tmp_path):
    (tmp_path / "c" / "0123456789abcdef").mkdir(parents=True)  # an entry Triton never finished
    with pytest.raises(kc.KernelCacheError, match="no compiled kernel"):
        kc.pack(tmp_path / "c", tmp_path / "a.tar.xz", IDENTITY)
    assert not (tmp_path / "a.tar.xz").exists()


def test_compiled_modules_without_a_group_are_packed(compiled, tmp_path):
    """Triton's driver and launcher modules (`<hash>/<name>.so`) are found by file name."""
    module = compiled[0] / ("f" * 64) / "cuda_utils.cpython-312-x86_64-linux-gnu.so"
    module.parent.mkdir()
    module.write_bytes(b"\x7fELF" + bytes(100))
    packed = kc.pack(compiled[0], tmp_path / "a.tar.xz", IDENTITY)
    assert (packed.kernels, packed.entries) == (2, 3)
    kc.install(packed.path, tmp_path / "c", IDENTITY)
    assert (tmp_path / "c" / module.parent.name / module.name).read_bytes() == module.read_bytes()


def test_off_a_gpu_nothing_is_installed(compiled, tmp_path, monkeypatch, caplog):
    packed = kc.pack(compiled[0], tmp_path / "a.tar.xz", IDENTITY)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "c"))
    with caplog.at_level(logging.INFO, "pagoda.runtime.kernel_cache"):
        assert kc.install_for(packed.path, "cpu") is None
    assert "not installed, this engine compiles no GPU kernels (cpu)" in caplog.text
    assert not (tmp_path / "c").exists()
