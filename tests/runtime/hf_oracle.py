"""Hugging Face transformers as the correctness oracle (imported by tests; not a conftest)."""

from __future__ import annotations

import torch


def hf_greedy(model, prompt: list[int], n: int) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy decoding with an explicit KV-cache loop (no EOS handling): tokens and logits."""
    tokens, logits = [], []
    with torch.no_grad():
        out = model(torch.tensor([prompt]), use_cache=True)
        for _ in range(n):
            step = out.logits[0, -1].float()
            logits.append(step)
            tok = int(step.argmax())
            tokens.append(tok)
            out = model(torch.tensor([[tok]]), past_key_values=out.past_key_values, use_cache=True)
    return tokens, logits


def stock_gguf_reader(path):
    """gguf-py's own `GGUFReader` of `path` (the parsing transformers relies on), slicing a plain
    ndarray view of the file's map where it sliced the memmap (`gguf_reader._FastFields._get`):
    the same fields and tensors (test_gguf.py compares them with the unchanged class's), parsed
    ~5x faster (SmolLM2's vocabulary is ~10^6 slices, each a memmap's `__array_finalize__`)."""
    import gguf
    from pagoda.runtime.model.gguf_reader import _FastFields

    return type("StockReader", (gguf.GGUFReader,), {"_get": _FastFields._get})(str(path))


def share_gguf_reader(monkeypatch, reader, path) -> None:
    """While `monkeypatch` holds, `gguf.GGUFReader(path)` (transformers' call: one per config,
    tokenizer and weights read) returns the already parsed `reader`; other paths parse anew."""
    import os

    import gguf

    real = gguf.GGUFReader

    def read(p, *args, **kwargs):
        return reader if os.path.samefile(p, path) else real(p, *args, **kwargs)

    monkeypatch.setattr(gguf, "GGUFReader", read)


# the shape every tiny checkpoint starts from (a test's overrides change it)
TINY = dict(
    vocab_size=300,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    eos_token_id=2,
    bos_token_id=1,
)


def randomize(model, scale: float = 3.0, noise: float = 0.2, seed: int | None = 1):
    """`model` with its matrices multiplied by `scale` (greedy picks well separated) and noise of
    std `noise` added to every 1-D weight (norms, biases), so that a norm read as w where (1 + w)
    was meant, or the other way round, changes the tokens; drawn from a generator seeded `seed`
    (None: torch's global stream). Returns the model."""
    g = None if seed is None else torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(scale)
            elif noise:
                p.add_(noise * torch.randn(p.shape, generator=g))
    return model


def save_tiny(model, path, vocab_size: int = TINY["vocab_size"]):
    """`model` saved to `path` with the word-level tokenizer and chat template; returns it."""
    model.save_pretrained(path)
    save_word_tokenizer(path, vocab_size)
    return model


def make_tiny_llama(path, **overrides):
    """Save a small random Llama (weights scaled so greedy decoding is not flat) with a word-level
    tokenizer to `path`; returns the transformers model."""
    import transformers

    cfg = dict(TINY, rope_theta=10000.0) | overrides
    torch.manual_seed(0)
    arch = cfg.pop("arch", "Llama")
    config = getattr(transformers, f"{arch}Config")(**cfg)
    model = getattr(transformers, f"{arch}ForCausalLM")(config).eval()
    return save_tiny(randomize(model, scale=4.0, noise=0.0), path, cfg["vocab_size"])


def save_word_tokenizer(path, vocab_size: int) -> None:
    """A word-level tokenizer ("w0" .. "w<vocab_size - 1>", split on whitespace) and a chat
    template ("w3 <content> w4 " a message) saved to `path` beside a tiny model."""
    import json

    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab_size)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path / "tokenizer.json"))
    template = "{% for m in messages %}w3 {{ m['content'] }} w4 {% endfor %}"
    (path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))


def hf_greedy_plain(model, prompt: list[int], n: int) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy decoding by recomputing the whole sequence each step (no KV cache, no `generate`
    processors): model(ids).logits[0, -1].argmax(). The reference for sliding windows, where a
    cache's eviction rules would be one more thing under test."""
    ids, tokens, logits = list(prompt), [], []
    with torch.no_grad():
        for _ in range(n):
            step = model(torch.tensor([ids]), use_cache=False).logits[0, -1].float()
            logits.append(step)
            tokens.append(int(step.argmax()))
            ids.append(tokens[-1])
    return tokens, logits


def hf_greedy_plain_batch(model, prompts: list[list[int]], n: int) -> list[tuple[list, list]]:
    """`hf_greedy_plain` of each prompt, the prompts run together: each step one forward of
    the sequences right-padded to the longest (a causal model's row never sees the positions
    after it, so the padding changes none of the rows read), not one forward per prompt (a
    tiny model's forward costs its Python, not its rows). (tokens, logits) per prompt. A rotary
    scaled by the forward's length (longrope's factors, dynamic NTK) would see the padded length:
    such a model's prompts run one by one."""
    if _length_scaled_rotary(model.config.to_dict()):
        return [hf_greedy_plain(model, p, n) for p in prompts]
    seqs = [list(p) for p in prompts]
    out = [([], []) for _ in prompts]
    with torch.no_grad():
        for _ in range(n):
            width = max(map(len, seqs))
            ids = torch.tensor([s + [0] * (width - len(s)) for s in seqs])
            logits = model(ids, use_cache=False).logits.float()
            for s, (tokens, steps), row in zip(seqs, out, logits):
                steps.append(row[len(s) - 1].clone())
                tokens.append(int(steps[-1].argmax()))
                s.append(tokens[-1])
    return out


def _length_scaled_rotary(config) -> bool:
    """Whether a config (dict, its sub-configs searched) names a rotary whose scaling depends on
    the sequence length of the forward."""
    if isinstance(config, dict):
        if config.get("rope_type", config.get("type")) in ("longrope", "dynamic"):
            return True
        return any(_length_scaled_rotary(v) for v in config.values())
    return isinstance(config, list) and any(_length_scaled_rotary(v) for v in config)


# config class prefix -> the causal LM class transformers builds from it
# (transformers runs EXAONE 3 and InternLM3 as Llama)
_LM_CLASSES = {"Gemma3Text": "Gemma3ForCausalLM", "Exaone": "LlamaForCausalLM"}
_LM_CLASSES["InternLM3"] = "LlamaForCausalLM"
_LM_CLASSES["GPT2"] = "GPT2LMHeadModel"
_LM_CLASSES["OpenAIGPT"] = "OpenAIGPTLMHeadModel"
_LM_CLASSES["CTRL"] = "CTRLLMHeadModel"
_LM_CLASSES["GPTNeoXJapanese"] = "GPTNeoXJapaneseForCausalLM"
_LM_CLASSES.update(Qwen3_5Text="Qwen3_5ForCausalLM", Qwen3_5MoeText="Qwen3_5MoeForCausalLM")
_LM_CLASSES["Qwen4ExpText"] = "Qwen4ExpForCausalLM"
_LM_CLASSES["MiniMaxM3VLText"] = "MiniMaxM3VLForCausalLM"
_LM_CLASSES["MllamaText"] = "MllamaForCausalLM"
_LM_CLASSES["InklingText"] = "InklingForCausalLM"
_LM_CLASSES["Inkling2Text"] = "Inkling2ForCausalLM"
_LM_CLASSES["Inkling2LoopText"] = "Inkling2LoopForCausalLM"
_LM_CLASSES["Dots3NoteText"] = "Dots3NoteForCausalLM"
_LM_CLASSES["Emu3Text"] = "Emu3ForCausalLM"
_LM_CLASSES["CohereCompassText"] = "CohereCompassForCausalLM"
_LM_CLASSES["Glm5Next"] = "Glm5NextForConditionalGeneration"  # (no text-only causal LM)


def make_tiny_model(path, arch: str, scale: float = 3.0, **overrides):
    """A small random `arch` model (a transformers config class prefix: Llama, Mistral, Qwen3,
    Gemma3Text, Mixtral, Qwen3Moe) saved to `path` with a word-level tokenizer and a chat
    template; returns the transformers model (float32, eval). Matrices are scaled by `scale` so
    greedy picks are well separated; every 1-D weight (norms, biases) gets noise too, so that a
    norm read as w where (1 + w) was meant, or the other way round, changes the tokens."""
    import transformers

    cfg = dict(TINY, pad_token_id=0) | overrides
    torch.manual_seed(0)
    config = getattr(transformers, f"{arch}Config")(**cfg)
    lm_class = _LM_CLASSES.get(arch, f"{arch}ForCausalLM")
    model = getattr(transformers, lm_class)(config).eval()
    return save_tiny(randomize(model, scale), path, cfg["vocab_size"])


def make_tiny_wrapped(path, cls: str, config, **randomize_args):
    """transformers' `cls` (a multimodal wrapper: Mistral3ForConditionalGeneration, ...) built
    from `config` under seed 0, randomized as `make_tiny_model`'s (`randomize_args`), saved with
    the word-level tokenizer of its text model's vocabulary; returns the model (eval)."""
    import transformers

    torch.manual_seed(0)
    model = randomize(getattr(transformers, cls)(config).eval(), **randomize_args)
    return save_tiny(model, path, config.get_text_config().vocab_size)


def check_config_refused(path, arch: str, edit: dict, words: str) -> None:
    """A one-layer `arch` checkpoint whose config.json gets `edit` is refused when the config is
    read (before a server binds: exit 2) in one line matching `words`."""
    import json

    import pytest
    from pagoda.runtime.model.loader import read_model_config

    make_tiny_model(path, arch, num_hidden_layers=1)
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, **edit}))
    with pytest.raises(ValueError, match=words) as e:
        read_model_config(str(path))
    assert "\n" not in str(e.value)


def drop_tokenizer(path) -> None:
    """The Hugging Face tokenizer files make_tiny_model wrote beside the checkpoint removed, for
    a test to write a tokenizer of another kind (SentencePiece's, tiktoken's) in their place."""
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                 "chat_template.jinja"):  # fmt: skip
        (path / name).unlink(missing_ok=True)


def save_multimodal_gemma3(path, cfg):
    """Gemma3ForConditionalGeneration from `cfg` (a transformers.Gemma3Config) with random
    weights scaled as make_tiny_model's, saved to `path` with a borrowed tokenizer: the model."""
    import transformers

    torch.manual_seed(0)
    model = randomize(transformers.Gemma3ForConditionalGeneration(cfg).eval(), seed=None)
    model.save_pretrained(path)
    make_tiny_model(path / "tok", "Llama")  # borrow its tokenizer files
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (path / f).write_bytes((path / "tok" / f).read_bytes())
    return model


def hf_prompt_logprobs(model, prompt: list[int]) -> torch.Tensor:
    """[len(prompt) - 1, vocab]: row j scores prompt token j + 1."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt]), use_cache=False).logits[0].float()
    return logits.log_softmax(-1)[:-1]


def check_prompt_logprobs(model, prompt: list[int], got, k: int = 3) -> None:
    """`got` (`RequestOutput.prompt_logprobs`: vLLM's shape) equals transformers' scores of
    `prompt` (float32 log_softmax of the whole sequence's logits), its top `k` and ranks."""
    import pytest

    assert got is not None and len(got) == len(prompt) and got[0] is None
    ref = hf_prompt_logprobs(model, prompt)
    for j in range(1, len(prompt)):
        row, tok, entry = ref[j - 1], prompt[j], got[j]
        assert next(iter(entry)) == tok, "the prompt token comes first, as vLLM's"
        assert entry[tok].logprob == pytest.approx(float(row[tok]), abs=2e-5)
        # its place by value, ties by index (as the engine ranks them)
        assert entry[tok].rank == int((row > row[tok]).sum() + (row[: tok + 1] == row[tok]).sum())
        assert entry[tok].decoded_token == f"w{tok}"
        top = row.topk(k)
        alternatives = {t: v for t, v in entry.items() if t != tok or v.rank <= k}
        expected = dict(zip(top.indices.tolist(), top.values.tolist()))
        assert set(alternatives) == set(expected)
        for t, v in expected.items():
            assert alternatives[t].logprob == pytest.approx(v, abs=2e-5)
