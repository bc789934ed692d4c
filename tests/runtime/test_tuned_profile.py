"""The tuned profile's format: validation, and the one folder layout (disk = ConfigMap)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pagoda.kernels import config as kc
from pagoda.runtime.tuned_profile import ProfileError, load_profile, profile_files, remove_profile
from profile_testlib import make_profile


def test_load_reports_what_is_wrong(tmp_path):
    with pytest.raises(ProfileError, match="no such directory"):
        load_profile(tmp_path / "nope")
    make_profile(tmp_path / "p")  # its profile.json given instead of its folder
    with pytest.raises(ProfileError) as err:
        load_profile(tmp_path / "p" / "profile.json")
    assert str(err.value) == (
        f"tuned profile {tmp_path}/p/profile.json: not a directory; give the folder "
        f"`pagoda tune --output` wrote ({tmp_path}/p)"
    )
    with pytest.raises(ProfileError, match="run `pagoda tune` first"):
        load_profile(tmp_path)
    (tmp_path / "profile.json").write_text("{not json")
    with pytest.raises(ProfileError, match="not valid JSON"):
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


def _profile_text(**fields) -> str:
    base = json.loads(json.dumps({
        "schema_version": 1, "device": "cpu: test", "model": "smollm2-135m", "dtype": "float32",
        "created": "2026-11-30T21:00:00Z", "scheduler": {"max_num_seqs": 12,
                                                       "max_num_batched_tokens": 96},
    }))  # fmt: skip
    for path, value in fields.items():
        *parents, leaf = path.split("__")
        node = base
        for p in parents:
            node = node[p]
        node[leaf] = value
    return json.dumps(base)


HUGE = "9" * 5000
HOSTILE = {
    "nested arrays": (b"[" * 100_000, "nests deeper"),
    "nested in a field": (_profile_text(engine="X").replace('"X"', "[" * 50_000).encode(),
                          "engine nests deeper"),
    "5,000-digit integer": (_profile_text(scheduler__max_num_seqs=0).replace(
        '"max_num_seqs": 0', f'"max_num_seqs": {HUGE}').encode(),
        "scheduler.max_num_seqs must be an integer in 1..16384, got an integer of 5000 digits"),
    "invalid UTF-8": (b'{"device": "\xff\xfe"}', "not UTF-8"),
    "huge file": (b" " * (1 << 20) + b"{}", "larger than"),
    "array": (b"[1, 2]", "expected a JSON object"),
    "truncated": (_profile_text()[:-20].encode(), "not valid JSON"),
    "NaN": (_profile_text(scheduler__max_num_seqs=0).replace(
        '"max_num_seqs": 0', '"max_num_seqs": NaN').encode(), "NaN"),
    "bool as int": (_profile_text(scheduler__max_num_seqs=True).encode(),
                    "scheduler.max_num_seqs must be an integer in 1..16384, got True"),
    "float as int": (_profile_text(scheduler__max_num_batched_tokens=1e9).encode(),
                     "scheduler.max_num_batched_tokens must be an integer in 1..2097152, got "
                     "1000000000.0"),
    "above the bound": (_profile_text(scheduler__max_num_seqs=1_000_000_000).encode(),
                        "scheduler.max_num_seqs must be an integer in 1..16384"),
    "string as int": (_profile_text(scheduler__max_num_seqs="64").encode(),
                      "scheduler.max_num_seqs must be an integer in 1..16384, got '64'"),
    "bool version": (_profile_text(schema_version=True).encode(), "schema_version True"),
    "scheduler array": (_profile_text(scheduler=[1]).encode(), "field 'scheduler' must be"),
    "device number": (_profile_text(device=7).encode(), "field 'device' must be"),
    "device huge": (_profile_text(device="x" * 10_000).encode(), "field 'device' must be"),
    "capacity string": (_profile_text(capacity={"decode_tokens_per_s": "fast"}).encode(),
                        "capacity.decode_tokens_per_s must be a finite number"),
    # `1e999` is not the `Infinity` literal, but parses as infinity: was accepted
    "capacity 1e999": (_profile_text(capacity={"decode_tokens_per_s": 7}).replace(
        '"decode_tokens_per_s": 7', '"decode_tokens_per_s": 1e999').encode(),
        "capacity.decode_tokens_per_s must be a finite number >= 0, got inf"),
    "negative capacity": (_profile_text(capacity={"prefill_tokens_per_s": -5}).encode(),
                          "capacity.prefill_tokens_per_s must be a finite number >= 0, got -5"),
    "float version": (_profile_text(schema_version=1.0).encode(), "schema_version 1.0 is not"),
    # was "no profile.json (run `pagoda tune` first)": null was taken for a missing file
    "null": (b"null", "expected a JSON object, got None"),
}  # fmt: skip


@pytest.mark.parametrize("case", HOSTILE)
def test_hostile_profile_is_one_error_naming_file_and_field(tmp_path: Path, case: str) -> None:
    raw, needle = HOSTILE[case]
    (tmp_path / "profile.json").write_bytes(raw)
    with pytest.raises(ProfileError) as err:
        load_profile(tmp_path)
    msg = str(err.value)
    assert "profile.json" in msg and needle in msg, msg
    assert "\n" not in msg and len(msg) < 600, msg


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (
            '{"device": "Tuned GPU", "kernels": {"matmul": [{"shape": {"n": 8, "k": 8}, "config": '
            '{"BLOCK_M": 1000000000, "BLOCK_N": "x"}}]}}',
            "kernels.matmul[0].config.BLOCK_M",
        ),
        (
            '{"device": "Tuned GPU", "kernels": {"matmul": [{"shape": {"n": 8}, "config": '
            '{"BLOCK_N": "x"}}]}}',
            "kernels.matmul[0].config.BLOCK_N must be a number, got 'x'",
        ),
        (
            '{"device": "Tuned GPU", "kernels": {"matmul": [{"shape": {"n": 8}, "config": '
            '{"BLOCK_N": 48}}]}}',
            "must be a power of two in 16..256, got 48",
        ),
        ('{"device": "Tuned GPU", "kernels": {"matmul": [', "not valid JSON"),
        ("[]", "expected a JSON object"),
        ('{"device": "Other GPU", "kernels": {}}', "belongs in Other_GPU.json"),
        ('{"device": "Tuned GPU", "kernels": {"nope": []}}', "kernels.'nope' is not a kernel"),
    ],
)
def test_a_profile_with_a_bad_kernel_config_is_refused(tmp_path, text, needle):
    make_profile(tmp_path)
    (tmp_path / "Tuned_GPU.json").write_text(text)
    with pytest.raises(ProfileError) as err:
        load_profile(tmp_path)
    assert "Tuned_GPU.json" in str(err.value) and needle in str(err.value), err.value


@pytest.mark.parametrize(
    ("fingerprint", "needle"),
    [
        ([576], "'shape_fingerprint' must be an object"),
        ({}, "'shape_fingerprint' must be an object"),
        ({"hidden_size": -1}, "shape_fingerprint.hidden_size must be an integer >= 0"),
        ({"hidden_size": True}, "shape_fingerprint.hidden_size must be an integer >= 0"),
        ({"hidden_size": 5.0}, "shape_fingerprint.hidden_size must be an integer >= 0"),
        ({"quantization": ""}, "shape_fingerprint.quantization must be an integer >= 0"),
        ({"quantization": None}, "shape_fingerprint.quantization must be an integer >= 0"),
    ],
)
def test_a_malformed_fingerprint_is_refused(tmp_path, fingerprint, needle):
    """The operator loads the profile with this loader before mounting it (InvalidProfile)."""
    make_profile(tmp_path, shape_fingerprint=fingerprint)
    with pytest.raises(ProfileError, match=needle):
        load_profile(tmp_path)
