"""Smoke run of the offline benchmark's long-context case on a short context."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def test_long_context_case_reports_prefill_and_decode():
    import long_context
    from pagoda.runtime.model.loader import load_model

    loaded = load_model("smollm2-135m")
    ids = long_context.long_context_ids(loaded.tokenizer, 300)
    assert len(ids) == 300
    row = long_context.pagoda_long_context(loaded, ids, 300, 4, "float32")
    assert row["prefill_s"] > 0 and row["decode_tok_s"] > 0
    assert "300-token context" in row["system"]
