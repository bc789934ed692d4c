"""Launch-config lookup (nearest bucket, device files, defaults), saving, and the split rule."""

from __future__ import annotations

import json
import os

import pytest
from pagoda.kernels import config as kc
from pagoda.kernels.config import (
    PACKAGE_CONFIG_DIR,
    clear_config_cache,
    config_file_name,
    get_kernel_config,
    save_kernel_config,
)

REQUIRED = {
    "paged_attention": {"BLOCK_M", "TILE_SIZE", "num_warps", "num_stages"},
    "prefill_attention": {"BLOCK_M", "TILE_SIZE", "num_warps", "num_stages"},
    "decode_attention": {
        "TILE_SIZE",
        "num_warps",
        "num_stages",
        "waves",
        "min_tokens_per_split",
        "max_splits",
    },
    "write_kv_cache": {"num_warps"},
    "matmul": {"BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages"},
    "rms_norm": {"num_warps"},
    "rotary_embedding": {"num_warps"},
    "silu_and_mul": {"BLOCK", "num_warps"},
    "fused_moe": {"BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages"},
    "fp8_matmul": {"BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages"},
    "fp8_quant": {"ROWS", "BLOCK", "num_warps"},
}


@pytest.fixture
def tuned_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(kc.CONFIG_DIR_ENV, str(tmp_path))
    clear_config_cache()
    yield tmp_path
    clear_config_cache()


def test_packaged_files_are_complete():
    files = sorted(PACKAGE_CONFIG_DIR.glob("*.json"))
    assert PACKAGE_CONFIG_DIR / "default.json" in files
    default = json.loads((PACKAGE_CONFIG_DIR / "default.json").read_text())
    assert set(default["kernels"]) == set(REQUIRED)
    for path in files:
        data = json.loads(path.read_text())
        assert path.name == config_file_name(data["device"])
        for kernel, buckets in data["kernels"].items():
            for bucket in buckets:
                assert bucket["shape"] and all(v > 0 for v in bucket["shape"].values())
                if path.name == "default.json":  # tuned files may override a subset
                    assert REQUIRED[kernel] <= set(bucket["config"]), (path.name, kernel)


def test_file_name_from_device_name():
    assert config_file_name("NVIDIA H200") == "NVIDIA_H200.json"
    assert config_file_name("NVIDIA A100-SXM4-80GB") == "NVIDIA_A100-SXM4-80GB.json"


def test_nearest_bucket_wins():
    short = get_kernel_config("paged_attention", {"head_dim": 128, "max_query_len": 1})
    mid = get_kernel_config("paged_attention", {"head_dim": 128, "max_query_len": 48})
    long = get_kernel_config("paged_attention", {"head_dim": 80, "max_query_len": 300})
    assert (short["BLOCK_M"], mid["BLOCK_M"], long["BLOCK_M"]) == (16, 32, 64)


def test_unknown_device_uses_defaults():
    shape = {"head_dim": 64, "max_query_len": 7}
    assert get_kernel_config("paged_attention", shape, "Some Future GPU") == get_kernel_config(
        "paged_attention", shape, "default"
    )


def test_packaged_device_file_overrides_defaults():
    h200 = get_kernel_config(
        "decode_attention", {"head_dim": 128, "num_seqs": 64, "max_seq_len": 4096}, "NVIDIA H200"
    )
    assert REQUIRED["decode_attention"] <= set(h200)


def test_saved_config_is_found_and_merged(tuned_dir):
    shape = {"head_dim": 128, "max_query_len": 1}
    path = save_kernel_config(
        "paged_attention", shape, {"TILE_SIZE": 64}, device="Test GPU", source="unit test"
    )
    assert path == tuned_dir / "Test_GPU.json"
    cfg = get_kernel_config("paged_attention", shape, "Test GPU")
    assert cfg["TILE_SIZE"] == 64 and cfg["BLOCK_M"] == 16  # the rest comes from default.json
    # replacing the same bucket keeps one entry; other kernels fall back to the defaults
    save_kernel_config("paged_attention", shape, {"TILE_SIZE": 16}, device="Test GPU")
    data = json.loads(path.read_text())
    assert len(data["kernels"]["paged_attention"]) == 1 and data["source"] == "unit test"
    assert get_kernel_config("paged_attention", shape, "Test GPU")["TILE_SIZE"] == 16
    assert get_kernel_config("rms_norm", {"hidden": 576}, "Test GPU") == get_kernel_config(
        "rms_norm", {"hidden": 576}
    )


def test_unknown_kernel_is_an_error():
    with pytest.raises(KeyError, match="no default"):
        get_kernel_config("no_such_kernel", {"x": 1})


def test_split_rule():
    from pagoda.kernels.decode_attention import choose_num_splits

    cfg = {"waves": 2, "min_tokens_per_split": 256, "max_splits": 16}

    def splits(batch: int, ctx: int, kv_heads: int = 8) -> int:
        return choose_num_splits(
            num_decodes=batch, num_kv_heads=kv_heads, max_seq_len=ctx, num_sms=132, config=cfg
        )

    assert splits(1, 32768) == 16  # one long sequence: as many segments as allowed
    assert splits(1, 512) == 2  # short context: segments stay >= 256 tokens
    assert splits(1, 200) == 1
    assert splits(16, 4096) == 2  # 128 programs already; two waves need 2 segments
    assert splits(64, 4096) == 1  # 512 programs fill an H200 twice over
    assert splits(256, 32768) == 1
    assert splits(0, 32768) == 1
    assert (
        choose_num_splits(
            num_decodes=1,
            num_kv_heads=8,
            max_seq_len=32768,
            num_sms=132,
            config={**cfg, "num_splits": 4},
        )
        == 4
    )  # a tuned value wins, still bounded by the context length


def test_search_order_first_directory_wins(tmp_path, monkeypatch):
    """`pagoda serve --tuned-profile DIR` puts DIR first: for a kernel its file names, it
    replaces files of that device further down the path (the packaged one included); fields it
    leaves out come from default.json."""
    first, second = tmp_path / "first", tmp_path / "second"
    shape = {"head_dim": 128, "num_seqs": 64, "max_seq_len": 4096}
    save_kernel_config(
        "decode_attention", shape, {"TILE_SIZE": 128}, device="NVIDIA H200", directory=first
    )
    save_kernel_config(
        "decode_attention", shape, {"TILE_SIZE": 16}, device="NVIDIA H200", directory=second
    )
    monkeypatch.setenv(kc.CONFIG_DIR_ENV, f"{first}{os.pathsep}{second}")
    clear_config_cache()
    try:
        cfg = get_kernel_config("decode_attention", shape, "NVIDIA H200")
        default = get_kernel_config("decode_attention", shape, "default")
        assert cfg == {**default, "TILE_SIZE": 128}  # not the packaged H200 stages/warps
    finally:
        clear_config_cache()


def test_a_file_without_a_kernel_leaves_the_next_files_buckets(tuned_dir):
    """A tuning run that measured only the matmuls keeps the packaged attention configs."""
    attention = {"head_dim": 64, "num_seqs": 256, "max_seq_len": 2048}
    packaged = get_kernel_config("decode_attention", attention, "NVIDIA H200")
    tuned = {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 4,
             "num_stages": 4}  # fmt: skip
    save_kernel_config("matmul", {"n": 3072, "k": 2048}, tuned, device="NVIDIA H200")
    clear_config_cache()
    assert get_kernel_config("matmul", {"n": 3072, "k": 2048}, "NVIDIA H200") == tuned
    assert get_kernel_config("decode_attention", attention, "NVIDIA H200") == packaged
    assert packaged != get_kernel_config("decode_attention", attention, "default")


def test_every_packaged_file_passes_the_load_time_check():
    from pagoda.kernels.config_schema import KERNELS, read_config_file

    assert set(KERNELS) == set(REQUIRED)
    for kernel, params in REQUIRED.items():
        assert params <= set(KERNELS[kernel].params), kernel
    for path in PACKAGE_CONFIG_DIR.glob("*.json"):
        read_config_file(path, complete=path.name == "default.json")


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[]", "expected a JSON object, got an array"),
        ('{"device": "Test GPU", "kernels": {"matmul": [{"shape": ', "not valid JSON"),
        ("[" * 100_000, "nests deeper than 16 levels"),
        ('{"device": "Test GPU", "kernels": []}', "field 'kernels' must be an object"),
        ('{"device": "Test GPU", "kernels": {"matmul": [{"shape": {"n": 64}, '
         '"config": {"BLOCK_M": 1000000000}}]}}', "kernels.matmul[0].config.BLOCK_M must be"),
        ('{"device": "Test GPU", "kernels": {"paged_attention": [{"shape": {"head_dim": 64}, '
         '"config": {"num_warps": 3}}]}}', "power of two"),
        ('{"device": "Test GPU", "kernels": {"rms_norm": [{"shape": {"hidden": 64}, '
         '"config": {"num_warps": true}}]}}', "must be a number, got True"),
        ('{"device": "Test GPU", "kernels": {"rms_norm": [{"shape": {"hidden": 64}, '
         '"config": {"BLOCK_Q": 16}}]}}', "'BLOCK_Q' is not a parameter of rms_norm"),
        ('{"device": "Test GPU", "kernels": {"rms_norm": [{"shape": {"width": 64}, '
         '"config": {"num_warps": 4}}]}}', "'width' is not a shape key of rms_norm"),
        ('{"device": "Test GPU", "kernels": {"rms_norm": [{"shape": {"hidden": -1}, '
         '"config": {"num_warps": 4}}]}}', "shape.hidden must be in"),
        ('{"device": "Test GPU", "kernels": {"decode_attention": [{"shape": {"head_dim": 64}, '
         '"config": {"waves": 1e999}}]}}', "config.waves must be in"),
        ('{"device": "Test GPU", "kernels": {"rms_norm": [{"shape": {"hidden": 64}, '
         '"config": {"num_warps": ' + "9" * 5000 + "}}]}}", "an integer of 5000 digits"),
    ],
)  # fmt: skip
def test_a_broken_file_is_one_clear_error_at_load_not_at_launch(tuned_dir, text, needle):
    (tuned_dir / "Test_GPU.json").write_text(text)
    with pytest.raises(kc.KernelConfigError) as err:
        kc.check_config_files("Test GPU")
    assert "Test_GPU.json" in str(err.value) and needle in str(err.value), err.value
    with pytest.raises(kc.KernelConfigError):  # the same error, never a KeyError/AttributeError
        get_kernel_config("rms_norm", {"hidden": 64}, "Test GPU")


def test_a_profiles_configs_apply_to_its_device_only(tmp_path):
    """A tuned folder's default.json is not everyone's default; its device file is its own."""
    shape = {"hidden": 576}
    packaged = get_kernel_config("rms_norm", shape, "default")
    for device, warps in (("default", 1), ("Tuned GPU", 2)):
        save_kernel_config("rms_norm", shape, {"num_warps": warps}, device=device,
                           directory=tmp_path)  # fmt: skip
    previous = kc.set_config_dirs([tmp_path])
    try:
        assert get_kernel_config("rms_norm", shape, "default") == packaged
        assert get_kernel_config("rms_norm", shape, "Some Other GPU") == packaged
        assert get_kernel_config("rms_norm", shape, "Tuned GPU")["num_warps"] == 2
        kc.check_config_files("Tuned GPU")
    finally:
        kc.set_config_dirs(previous)


def test_save_refuses_a_config_serving_would_refuse(tuned_dir):
    with pytest.raises(kc.KernelConfigError, match="BLOCK_M must be a power of two"):
        save_kernel_config("matmul", {"n": 64, "k": 64}, {"BLOCK_M": 48}, device="Test GPU")
    assert not (tuned_dir / "Test_GPU.json").exists()


GEMM = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4, "num_stages": 2}


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        ({**GEMM, "BLOCK_N": 24}, "BLOCK_N must be a power of two"),
        ({k: v for k, v in GEMM.items() if k != "GROUP_M"}, "lacks GROUP_M"),
        ({**GEMM, "TILE_SIZE": 32}, "'TILE_SIZE' is not a parameter"),
    ],
)
def test_an_explicit_launch_config_is_checked_before_the_launch(device, config, needle):
    """``config=`` (tuning sweeps) is held to the file format: a non-power-of-two tile or a
    missing field is a KernelConfigError naming it, not a KeyError or a Triton error."""
    import torch
    from pagoda.kernels import fp8, fp8_linear, fused_experts, linear

    x, w = torch.randn(4, 32, device=device), torch.randn(32, 32, device=device)
    w8, s8 = fp8.quantize_weight(w)
    ids = torch.zeros((4, 1), dtype=torch.int32, device=device)
    calls = [
        lambda: linear(x=x, weight=w, config=config),
        lambda: fp8_linear(x=x, weight=w8, weight_scale=s8, config=config),
        lambda: fused_experts(x, torch.randn(2, 64, 32, device=device),
                              torch.randn(2, 32, 32, device=device),
                              torch.ones((4, 1), device=device), ids, config=config),
    ]  # fmt: skip
    for call in calls:
        with pytest.raises(kc.KernelConfigError, match=needle):
            call()
