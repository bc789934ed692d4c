"""Fixtures for runtime tests: the embedded model loaded once, and the Hugging Face oracle."""

from __future__ import annotations

import dataclasses
import functools
import os

import pytest
import torch
from pagoda.runtime.model.loader import LoadedModel, load_model

# A few paragraphs of plain English, cut to exact token lengths by the tests.
CORPUS = """\
The history of computing is a story of abstraction. Early machines were programmed by rewiring
panels; later, stored programs let the same hardware run any algorithm that could be written
down. Assemblers gave names to instructions, compilers gave names to whole computations, and
operating systems gave every program the illusion of a machine of its own. Virtual memory is one
of the most successful of these illusions: each process sees a large, contiguous address space,
while the hardware maps fixed-size pages of it onto whatever physical frames happen to be free.
Serving large language models borrowed the same idea. The attention keys and values of every
sequence are stored in fixed-size blocks, and a block table maps the logical positions of a
sequence to physical blocks, so memory is allocated on demand and almost nothing is wasted.
Because many requests begin with the same system prompt, blocks that hold identical prefixes can
be shared, and a new request can skip computing a prefix that another request already computed.
Scheduling then becomes a matter of bookkeeping: at every iteration the scheduler decides which
sequences advance and by how many tokens, so that short decodes are never stuck behind a long
prompt. Rivers carve valleys over millions of years, carrying sediment from mountains to the sea.
In the delta the water slows, the sediment settles, and new land is built grain by grain. Farmers
have cultivated such deltas for thousands of years, because the soil is rich and water is close.
The same floods that bring fertility also bring danger, and so the people of the delta learned
to build levees, to read the sky, and to move their houses when the river changed its course.
"""


@pytest.fixture(scope="session")
def smol() -> LoadedModel:
    """Shared by many engines, so its weights are dequantized once (a GGUF's are read lazily)."""
    m = load_model("smollm2-135m")
    return dataclasses.replace(m, weights=dict(m.weights))


@pytest.fixture(scope="session")
def corpus_ids(smol) -> list[int]:
    ids = smol.tokenizer.encode(CORPUS)
    while len(ids) < 2000:
        ids = ids + ids
    return ids


@pytest.fixture(scope="session")
def smol_reader(smol):
    """gguf-py's reader of the embedded GGUF, parsed once per process (`stock_gguf_reader`): the
    tiny GGUFs of test_gguf.py take its vocabulary, transformers' reads of the file take it."""
    pytest.importorskip("gguf")
    from hf_oracle import stock_gguf_reader

    return stock_gguf_reader(smol.path)


@pytest.fixture(scope="session")
def hf_model(smol, smol_reader):
    """transformers loading the same GGUF in float32: the correctness oracle."""
    transformers = pytest.importorskip("transformers")
    gguf = pytest.importorskip("gguf")
    from hf_oracle import share_gguf_reader

    # transformers parses the GGUF twice (config, then tensors) and rebuilds gguf's tensor-name
    # map once per module (~400 times); both are pure, so the file is parsed once per process
    # (`smol_reader`) and the map memoized (the load took ~40% less CPU for the map and cache).
    with pytest.MonkeyPatch.context() as mp:
        share_gguf_reader(mp, smol_reader, smol.path)
        mp.setattr(gguf, "get_tensor_name_map", functools.cache(gguf.get_tensor_name_map))
        model = transformers.AutoModelForCausalLM.from_pretrained(
            os.path.dirname(smol.path), gguf_file=os.path.basename(smol.path), dtype=torch.float32
        )
    model.eval()
    return model
