"""The recurrent families' checkpoints (tests/runtime/hybrid_cases.py), shared by their test
files: each written, loaded and run through transformers once per pytest process."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """name -> (checkpoint directory, transformers model, loaded checkpoint, transformers'
    greedy tokens and logits per prompt): `hybrid_cases.Built`. A test module whose cases are
    not hybrid_cases' binds a `built` of its own (`arch_cases.built_fixture`)."""
    from hybrid_cases import Built

    return Built(tmp_path_factory)
