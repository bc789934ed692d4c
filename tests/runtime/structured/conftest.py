"""Fixtures for structured-output tests: the embedded model's tokenizer alone (no weights)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def smol_tokenizer():
    from pagoda.runtime.model.gguf_loader import _reader, read_config, read_tokenizer
    from pagoda.runtime.model.loader import resolve_model_path

    reader = _reader(resolve_model_path("smollm2-135m"))
    config = read_config(reader)
    tok = read_tokenizer(reader, config)
    tok.model_vocab_size = config.vocab_size
    return tok


@pytest.fixture(scope="session")
def compiler(smol_tokenizer):
    from pagoda.runtime.structured.compiler import compiler_for

    return compiler_for(smol_tokenizer, smol_tokenizer.model_vocab_size)
