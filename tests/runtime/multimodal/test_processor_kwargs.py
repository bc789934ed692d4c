"""`multimodal.processor_kwargs` (vLLM's --mm-processor-kwargs and a request's
mm_processor_kwargs): the flag's JSON read once (`option_rules.parse_processor_kwargs`), each key checked against the family's
processor (Qwen2-VL's min_pixels / max_pixels; LLaVA's none). Qwen2-VL's bounds against
transformers' processor: tests/runtime/multimodal/test_qwen2_vl_processing.py."""

from __future__ import annotations

import pytest
from pagoda.runtime import option_rules
from pagoda.runtime.config import EngineConfig
from pagoda.runtime.multimodal import processor_kwargs
from pagoda.runtime.multimodal.config import ImageProcessing, VisionConfig
from pagoda.runtime.multimodal.qwen2_vl_config import QwenVisionConfig
from pagoda.runtime.multimodal.qwen2_vl_processing import QwenImageProcessing

LLAVA = VisionConfig(32, 64, 2, 4, image_size=30, patch_size=10, image_token_index=7,
                     processing=ImageProcessing(shortest_edge=30, crop=(30, 30)))  # fmt: skip
PROCESSOR = {"min_pixels": 256, "max_pixels": 16384, "patch_size": 8}
QWEN = QwenVisionConfig(kind="qwen2_vl", width=32, intermediate_size=64, depth=2, num_heads=2,
                        out_size=64, patch_size=8, temporal_patch_size=2, merge_size=2,
                        image_token_index=290, processing=QwenImageProcessing(**PROCESSOR))  # fmt: skip


def test_the_flag_is_a_json_object_read_once():
    parse = option_rules.parse_processor_kwargs
    assert parse('{"max_pixels": 4096}') == {"max_pixels": 4096}
    assert parse({"min_pixels": 1}) == {"min_pixels": 1}
    assert parse(None) is None and parse("{}") is None
    with pytest.raises(ValueError, match="mm_processor_kwargs: not JSON"):
        parse("max_pixels=4")
    with pytest.raises(ValueError, match="mm_processor_kwargs must be a JSON object"):
        parse("[1, 2]")
    cfg = EngineConfig.create("m", mm_processor_kwargs='{"max_pixels": 4096}')
    assert cfg.mm_processor_kwargs == {"max_pixels": 4096}
    with pytest.raises(ValueError, match="must be a JSON object"):
        EngineConfig.create("m", mm_processor_kwargs="[]")
    with pytest.raises(ValueError, match="mm_processor_kwargs must be a JSON object"):
        processor_kwargs.apply(LLAVA, [("max_pixels", 1)], "mm_processor_kwargs")  # (a prompt's)


def test_a_key_the_familys_processor_does_not_read_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"--mm-processor-kwargs: 'do_resize' is not a setting "
                       r"of the qwen2_vl image processor \(it reads min_pixels, max_pixels\)"):  # fmt: skip
        processor_kwargs.apply(QWEN, {"max_pixels": 4096, "do_resize": False})
    with pytest.raises(ValueError, match="'size' is not a setting of the llava image processor "
                       r"\(it reads none"):  # fmt: skip
        processor_kwargs.apply(LLAVA, {"size": 10}, "--mm-processor-kwargs")
    with pytest.raises(ValueError, match="mm_processor_kwargs: this model reads no images"):
        processor_kwargs.apply(None, {"max_pixels": 4096}, "mm_processor_kwargs")
    for bad, match in (({"max_pixels": "4096"}, "positive integer"),
                       ({"min_pixels": True}, "positive integer"),
                       ({"max_pixels": 0}, "positive integer"),
                       ({"min_pixels": 20000}, "min_pixels 20000 and max_pixels 16384")):  # fmt: skip
        with pytest.raises(ValueError, match=match):
            processor_kwargs.apply(QWEN, bad)
    assert processor_kwargs.apply(LLAVA, None) is LLAVA and processor_kwargs.apply(None, {}) is None
    assert processor_kwargs.apply(QWEN, {}) is QWEN
