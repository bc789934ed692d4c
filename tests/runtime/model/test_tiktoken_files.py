"""A tiktoken BPE directory (Kimi K2, Moonlight: `tiktoken.model`, no tokenizer.json) read
without its remote code (`model/tiktoken_files.py`): ids equal tiktoken's (its algorithm written
out in `tiktoken_testlib`, as `tiktoken` is not installed here) on tricky text, special tokens
kept whole and numbered after the ranks, the merges equal transformers' `TikTokenConverter`'s,
decoding whole and streamed gives the text back, unknown tokenizer code is refused. The server
side: tests/server/test_tiktoken_server.py."""

from __future__ import annotations

import json
import pickle

import pytest
from pagoda.runtime.model import tiktoken_files
from pagoda.runtime.model.hf_loader import read_tokenizer
from tiktoken_testlib import PAT, TEXT, tiktoken_encode, train_ranks, write_tiktoken_dir
from transformers.convert_slow_tokenizer import TikTokenConverter


@pytest.fixture(scope="module")
def ranks() -> dict[bytes, int]:
    return train_ranks()


@pytest.fixture(scope="module")
def kimi(tmp_path_factory, ranks):
    """(directory, special tokens by text, the engine's Tokenizer) of a Kimi-style tiktoken
    directory holding only the tokenizer files."""
    path = tmp_path_factory.mktemp("kimi-tok")
    specials = write_tiktoken_dir(path, ranks)
    n = len(ranks)
    config = type("C", (), {"bos_token_id": n, "eos_token_ids": (n + 2,)})()
    return path, specials, read_tokenizer(path, config)


def test_the_regex_is_tokenization_kimis_and_the_llama_cpp_tables():
    assert tiktoken_files.KIMI.pattern == PAT


def test_merges_are_transformers_tiktoken_converters(ranks, tmp_path):
    class Converter(TikTokenConverter):  # its reader needs `tiktoken`: give it the ranks
        @staticmethod
        def load_tiktoken_bpe(_):
            return ranks

    vocab, merges = Converter(vocab_file="unused").extract_vocab_merges_from_model("unused")
    assert tiktoken_files.merges_from_ranks(ranks) == (vocab, merges)
    assert len(merges) > len(ranks) - 256  # some tokens split more than one way


@pytest.mark.parametrize(
    "text",
    [TEXT, TEXT.lower(), TEXT.upper(), "   leading and trailing   ", "1234567890" * 3,
     "中文中文中文", "Helloworld THEYRE indentedTab quickbrownfoxes 你好世界中文 HTTPServers",
     "words unseen whole: they're, we'll, Hello-World, WORLD-hello, cafés 1000000000",
     "\n\n\t\t  \r\n", "a" * 300, "ÿþ\u00a0\u200b\ufeff", ""],
)  # fmt: skip
def test_ids_are_tiktokens_and_decode_back(kimi, ranks, text):
    _, specials, tok = kimi
    want = tiktoken_encode(ranks, specials, text)
    assert tok.encode(text) == want  # no BOS: tokenization_kimi adds none
    assert tok.decode(want) == text
    step = tok.stream_decoder([])
    assert "".join(filter(None, map(step, want))) == text  # the incremental detokenizer


def test_special_tokens_are_kept_whole_numbered_after_the_ranks(kimi, ranks):
    _, specials, tok = kimi
    n = len(ranks)
    text = f"[BOS]<|im_user|>user<|im_middle|>hi 你好<|im_end|><|reserved_token_{n + 5}|>[EOS]"
    ids = tok.encode(text)
    assert ids == tiktoken_encode(ranks, specials, text)
    assert ids[:2] == [n, n + 3] and ids[-2:] == [n + 5, n + 1]
    assert tok.vocab_size == n + 258
    assert tok.decode(ids, skip_special_tokens=False) == text
    assert tok.decode(ids) == "userhi 你好"
    assert tok.encode_as_text("<|im_end|>") == tiktoken_encode(ranks, {}, "<|im_end|>")
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert (
        prompt == "<|im_user|>user<|im_middle|>hi<|im_end|><|im_assistant|>assistant<|im_middle|>"
    )


def test_unknown_or_different_tokenizer_code_is_refused(tmp_path, ranks):
    write_tiktoken_dir(tmp_path, ranks, module="tokenization_other")
    with pytest.raises(ValueError, match=r"tokenization_other.*not one whose split regex is known"):
        read_tokenizer(tmp_path, None)
    write_tiktoken_dir(tmp_path, ranks)
    kimi_code = "pat_str = '|'.join([%s])\nnum_reserved_special_tokens = 256\n"
    (tmp_path / "tokenization_kimi.py").write_text(
        kimi_code % ", ".join(f"r'''{a}'''" for a in tiktoken_files.KIMI.alternatives)
    )
    config = type("C", (), {"bos_token_id": None, "eos_token_ids": ()})()
    assert read_tokenizer(tmp_path, config).encode("ok") == tiktoken_encode(ranks, {}, "ok")
    (tmp_path / "tokenization_kimi.py").write_text(kimi_code % r"r'''\p{N}{1,2}'''")
    with pytest.raises(ValueError, match="splits or numbers its special tokens differently"):
        read_tokenizer(tmp_path, config)


def test_a_bad_tiktoken_file_is_one_line(tmp_path, ranks):
    write_tiktoken_dir(tmp_path, ranks)
    (tmp_path / "tiktoken.model").write_text("IQ== 0\nnot-base64! 1\n")
    with pytest.raises(ValueError, match=r"tiktoken.model:2: not a tiktoken line"):
        read_tokenizer(tmp_path, None)
    (tmp_path / "tiktoken.model").write_text("IQ== 0\nIg== 2\n")
    with pytest.raises(ValueError, match=r"ranks are not 0..1"):
        read_tokenizer(tmp_path, None)


@pytest.mark.parametrize("sorts", [True, False])
def test_tools_keys_are_sorted_where_the_kimi_code_sorts_them(tmp_path, ranks, sorts):
    """Later tokenization_kimi.py releases render `tools` through `deep_sort_dict`."""
    write_tiktoken_dir(tmp_path, ranks)
    tcfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    tcfg["chat_template"] = "{{ tools | tojson }}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(tcfg))
    code = ", ".join(f"r'''{a}'''" for a in tiktoken_files.KIMI.alternatives)
    code = f"pat_str = '|'.join([{code}])\nnum_reserved_special_tokens = 256\n"
    (tmp_path / "tokenization_kimi.py").write_text(
        code + ("    tools = deep_sort_dict(tools)\n" if sorts else "")
    )
    config = type("C", (), {"bos_token_id": None, "eos_token_ids": ()})()
    tok = pickle.loads(pickle.dumps(read_tokenizer(tmp_path, config)))  # as the API process
    tool = {
        "type": "function",
        "function": {"name": "f", "parameters": {"z": 1, "a": [{"y": 0, "b": 0}]}},
    }
    got = tok.apply_chat_template([{"role": "user", "content": "x"}], tools=[tool])
    want = {
        "function": {"name": "f", "parameters": {"a": [{"b": 0, "y": 0}], "z": 1}},
        "type": "function",
    }
    assert got == json.dumps([want if sorts else tool], ensure_ascii=False)
