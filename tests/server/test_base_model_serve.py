"""`pagoda serve` on a base model without rotary and without a chat template: a tiny OPT
written by transformers, its tokenizer GPT-2's two files (vocab.json + merges.txt, no
tokenizer.json, the special tokens in special_tokens_map.json: OPT's layout), through the
`openai` SDK."""

from __future__ import annotations

import json

import openai
import pytest
from hf_oracle import hf_greedy_plain, make_tiny_model
from server_testlib import ServerProcess

transformers = pytest.importorskip("transformers")
TEXT = "Hello world, the quick brown fox jumps over the lazy dog. "


def write_opt(path):
    """(transformers' model, its tokenizer) of a tiny post-norm OPT with projections."""
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([TEXT * 3, "éa ünï 123 ok"], vocab_size=300,
                            special_tokens=["<s>", "<pad>", "</s>"])  # fmt: skip
    vocab = bpe.get_vocab_size()
    model = make_tiny_model(path, "OPT", vocab_size=vocab, ffn_dim=128, bos_token_id=2,
                            eos_token_id=2, pad_token_id=1, do_layer_norm_before=False,
                            word_embed_proj_dim=32)  # fmt: skip
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (path / name).unlink()
    bpe.save_model(str(path))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "GPT2Tokenizer", "add_bos_token": True}))  # fmt: skip
    (path / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "</s>", "eos_token": "</s>", "unk_token": "</s>", "pad_token": "<pad>"}))  # fmt: skip
    return model, transformers.AutoTokenizer.from_pretrained(path)


@pytest.mark.slow
@pytest.mark.e2e
def test_a_base_model_answers_completions_and_refuses_chat(tmp_path):
    """Completions: the prompt tokenized as transformers' GPT2Tokenizer does (`</s>` first),
    the answer transformers' greedy tokens decoded, whole and streamed. Chat: a 400 naming
    the missing template, the server intact after."""
    model, tok = write_opt(tmp_path)
    prompt = "the lazy fox"
    ids = tok(prompt)["input_ids"]
    want, _ = hf_greedy_plain(model, ids, 6)
    srv = ServerProcess("--model", str(tmp_path), "--dtype", "float32", "--kv-cache-memory",
                        "16MiB", "--log-level", "warning")  # fmt: skip
    try:
        srv.wait_ready()
        client = openai.OpenAI(base_url=srv.base + "/v1", api_key="x", max_retries=0)
        name = client.models.list().data[0].id
        kw = dict(model=name, prompt=prompt, max_tokens=6, temperature=0,
                  extra_body={"ignore_eos": True})  # fmt: skip
        got = client.completions.create(**kw)
        streamed = [c.choices[0].text for c in client.completions.create(**kw, stream=True)
                    if c.choices]  # fmt: skip
        with pytest.raises(openai.BadRequestError, match="no chat template") as e:
            client.chat.completions.create(
                model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
        again = client.completions.create(**kw)
    finally:
        srv.stop()
    assert e.value.status_code == 400
    assert got.usage.prompt_tokens == len(ids)
    text = tok.decode(want, skip_special_tokens=True)
    assert got.choices[0].text == text == "".join(streamed) == again.choices[0].text
