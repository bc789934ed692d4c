"""Fixtures for structured-output tests: the embedded model's tokenizer alone (no weights)."""

from __future__ import annotations

import pytest
import structured_testlib


@pytest.fixture(scope="session")
def smol_tokenizer():
    return structured_testlib.smol_tokenizer()


@pytest.fixture(scope="session")
def compiler(smol_tokenizer):
    from pagoda.runtime.structured.compiler import compiler_for

    return compiler_for(smol_tokenizer, smol_tokenizer.model_vocab_size)
