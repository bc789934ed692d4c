"""A SentencePiece directory (`tokenizer.model` + tokenizer_config.json, no tokenizer.json: Llama
2 era, InternLM3) read without transformers' converter (`model/spm_files.py`): tiny models
trained here (BPE and Unigram, byte fallback on and off, user-defined pieces, SentencePiece's
NFKC normalizer with whitespace removal, no dummy prefix) give transformers' slow tokenizer's
ids (SentencePiece's own encode between special tokens) on hostile text; decoding, whole and
streamed, gives SentencePiece's text; `legacy: false` gives transformers' fast Llama tokenizer's
ids; unknown tokenizer code and broken files are refused in one line. The server side:
tests/server/test_spm_server.py."""

from __future__ import annotations

import json
import pickle

import pytest
import sentencepiece as spm
from pagoda.runtime.engine.detokenizer import IncrementalDetokenizer
from pagoda.runtime.model import spm_files
from pagoda.runtime.model.hf_loader import read_tokenizer
from sentencepiece_testlib import HOSTILE, USER_DEFINED, slow_tokenizer, train, write_spm_dir

CONFIG = type("C", (), {"bos_token_id": 1, "eos_token_ids": (2,)})()
NFKC = dict(normalization_rule_name="nmt_nfkc", remove_extra_whitespaces=True)
VARIANTS = {
    "bpe": ("bpe", True, {}),
    "bpe-no-byte-fallback": ("bpe", False, {}),
    "unigram": ("unigram", True, {}),
    "unigram-no-byte-fallback": ("unigram", False, {}),
    "bpe-nfkc": ("bpe", True, NFKC),
    "unigram-nfkc": ("unigram", True, NFKC),
    "bpe-no-dummy-prefix": ("bpe", True, {"add_dummy_prefix": False}),
}


@pytest.fixture(scope="module", params=list(VARIANTS))
def variant(request, tmp_path_factory):
    """(SentencePieceProcessor, slow oracle, the engine's Tokenizer, trainer options)."""
    kind, byte_fallback, options = VARIANTS[request.param]
    model = train(kind, byte_fallback, **options)
    path = tmp_path_factory.mktemp(request.param)
    write_spm_dir(path, model)
    tok = pickle.loads(pickle.dumps(read_tokenizer(path, CONFIG)))  # as the API process has it
    return spm.SentencePieceProcessor(model_proto=model), slow_tokenizer(path), tok, options


def test_ids_are_the_slow_tokenizers_and_sentencepieces(variant):
    sp, slow, tok, _ = variant
    for text in HOSTILE:
        ids = tok.encode(text, add_special_tokens=False)
        assert ids == slow.encode(text, add_special_tokens=False), text
        if not any(s in text for s in ("<s>", "</s>", *USER_DEFINED)):
            assert ids == sp.encode(text), text
    assert tok.encode("hi") == [1, *sp.encode("hi")]  # add_bos_token
    assert tok.encode_as_text("<s><|im_end|>")[:1] != [1]  # user content: special text as text


def test_decoding_whole_and_streamed_is_sentencepieces(variant):
    sp, _, tok, options = variant
    byte_a = sp.piece_to_id("<0x41>")  # logprobs' bytes and the detokenizer read these
    assert tok.fallback_byte(byte_a) == (0x41 if sp.is_byte(byte_a) else None)
    for text in HOSTILE:
        ids = tok.encode(text, add_special_tokens=False)
        if sp.unk_id() in ids:  # skipped as a special token (sp writes " \u2047 ")
            assert tok.decode(ids, skip_special_tokens=False).count("<unk>") == ids.count(0)
        elif not any(s in text for s in ("<s>", "</s>", *USER_DEFINED)):
            assert tok.decode(ids) == sp.decode(ids), text
            if sp.is_byte(sp.piece_to_id("<0x41>")) and not options and "\u2581" not in text:
                assert tok.decode(ids) == text  # a lossless model gives the text back
        for skip in (True, False):
            whole = tok.decode(ids, skip_special_tokens=skip)
            step = tok.stream_decoder([], skip_special_tokens=skip)
            assert "".join(filter(None, map(step, ids))) == whole, text
            for prompt in ([], [1]):  # after a prompt the first space stays (as vLLM's)
                detok = IncrementalDetokenizer(tok, prompt, skip_special_tokens=skip)
                for i in ids:
                    detok.add_tokens([i])
                detok.flush(len(ids))
                step = tok.stream_decoder(prompt, skip_special_tokens=skip)
                assert detok.pop_delta(True) == "".join(filter(None, map(step, ids))), text


@pytest.mark.parametrize("legacy, prefix", [(False, True), (True, False)])
def test_legacy_false_or_no_prefix_space_is_transformers_fast_llama_tokenizer(
    tmp_path, legacy, prefix
):
    """`legacy: false`: one prefix at the start of the text (a Metaspace "first");
    `add_prefix_space: false`: none, whatever the file's add_dummy_prefix; as transformers'
    LlamaTokenizer builds them from the same vocabulary and merges."""
    from transformers import LlamaTokenizer
    from transformers.tokenization_utils_sentencepiece import SentencePieceExtractor

    write_spm_dir(tmp_path, train("bpe", True), legacy=legacy, add_prefix_space=prefix)
    vocab, _, merges = SentencePieceExtractor(str(tmp_path / "tokenizer.model")).extract()
    fast = LlamaTokenizer(vocab=vocab, merges=merges, legacy=legacy, add_prefix_space=prefix)
    fast.add_special_tokens({"additional_special_tokens": USER_DEFINED})
    tok = read_tokenizer(tmp_path, CONFIG)
    for text in HOSTILE:
        assert tok.encode(text, add_special_tokens=False) == fast.encode(
            text, add_special_tokens=False
        ), text
    assert tok.encode("<|im_start|>a", add_special_tokens=False)[1:] != [
        tok.backend.token_to_id("\u2581a")
    ]
    for text in ("Hello world", " a b", "东京 🙂\n x"):
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == fast.decode(ids), text


def test_internlm3_layout_add_eos_and_the_chat_template(tmp_path):
    """InternLM3's layout: its remote code named (not run) by auto_map, add_eos_token honoured,
    the chat template from tokenizer_config.json rendered with its bos_token."""
    model = train("bpe", True)
    write_spm_dir(
        tmp_path, model, tokenizer_class="InternLM3Tokenizer", add_eos_token=True,
        auto_map={"AutoTokenizer": ["tokenization_internlm3.InternLM3Tokenizer", None]},
    )  # fmt: skip
    sp = spm.SentencePieceProcessor(model_proto=model)
    tok = pickle.loads(pickle.dumps(read_tokenizer(tmp_path, CONFIG)))
    assert tok.encode("hello world") == [1, *sp.encode("hello world"), 2]
    text = tok.apply_chat_template([{"role": "user", "content": "你好 🙂"}])
    assert text == "<s><|im_start|>user\n你好 🙂<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.encode(text, add_special_tokens=False)
    assert ids == slow_tokenizer(tmp_path).encode(text, add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=False) == (
        "<s><|im_start|> user\n你好 🙂<|im_end|> \n<|im_start|> assistant\n"
    )  # transformers' fast Llama tokenizers' text: each segment's dummy prefix kept


def test_read_spec_reads_the_trainer_and_normalizer_fields():
    spec = spm_files.read_spec(train("unigram", False, **NFKC, add_dummy_prefix=False))
    assert (spec.model_type, spec.byte_fallback, spec.add_dummy_prefix) == (1, False, False)
    assert spec.remove_extra_whitespaces and spec.charsmap
    assert spec.types[:3] == (2, 3, 3) and spec.types[3] == 4  # unk, <s>, </s>, user-defined
    spec = spm_files.read_spec(train("bpe", True))
    assert (spec.model_type, spec.byte_fallback, spec.add_dummy_prefix) == (2, True, True)
    assert not spec.remove_extra_whitespaces and not spec.charsmap
    with pytest.raises(ValueError, match=r"wire type|varint|length"):
        spm_files.read_spec(b"\x0a\xff")


def test_unknown_code_other_classes_and_broken_files_are_refused(tmp_path):
    model = train("bpe", True)
    write_spm_dir(
        tmp_path, model, auto_map={"AutoTokenizer": ["tokenization_chatglm.ChatGLM", None]}
    )
    with pytest.raises(ValueError, match=r"tokenization_chatglm.py\) is not one reproduced here"):
        read_tokenizer(tmp_path, CONFIG)
    write_spm_dir(tmp_path, model, tokenizer_class="T5Tokenizer")
    with pytest.raises(ValueError, match=r"tokenizer_class 'T5Tokenizer' is not read from it"):
        read_tokenizer(tmp_path, CONFIG)
    write_spm_dir(tmp_path, train("bpe", False, model_type="word", vocab_size=100))
    with pytest.raises(ValueError, match=r"is a SentencePiece Word model: BPE and Unigram"):
        read_tokenizer(tmp_path, CONFIG)
    tcfg = write_spm_dir(tmp_path, model)
    tcfg["added_tokens_decoder"]["5"] = {"content": "<|other|>", "special": True}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(tcfg))
    with pytest.raises(ValueError, match=r"names token 5 '<\|other\|>', but tokenizer.model has"):
        read_tokenizer(tmp_path, CONFIG)
    tcfg["added_tokens_decoder"] = {"999": {"content": "<pad>", "special": True}}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(tcfg))
    with pytest.raises(ValueError, match=r"'<pad>' would get id 420, not its id 999"):
        read_tokenizer(tmp_path, CONFIG)
    tcfg["added_tokens_decoder"] = {"420": {"content": "<pad>", "special": True}}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(tcfg))
    (tmp_path / "added_tokens.json").write_text('{"<pad>": 420, "<|tool|>": 421}')  # older layout
    tok = read_tokenizer(tmp_path, CONFIG)
    assert tok.encode("a<pad><|tool|>", add_special_tokens=False)[-2:] == [420, 421]
    assert tok.decode([420, 421]) == "<|tool|>"  # <pad> special (the decoder's), <|tool|> not
    for broken in (b"version https://git-lfs.github.com/spec/v1\n", model[: len(model) // 2]):
        (tmp_path / "tokenizer.model").write_bytes(broken)
        with pytest.raises(ValueError, match=r"tokenizer.model is not a SentencePiece model"):
            read_tokenizer(tmp_path, CONFIG)
