"""Checkpoints as they come: shards with an index, 16-bit weights, Gemma 3's multimodal layout,
generation_config.json (EOS ids, sampling defaults), both chat template files, and a clear
refusal of an architecture the engine does not run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hf_oracle import hf_greedy_plain, make_tiny_model, save_multimodal_gemma3
from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.model.hf_tables import HF_ARCHITECTURES
from pagoda.runtime.model.loader import load_model, read_model_config, read_tokenizer

transformers = pytest.importorskip("transformers")
PROMPT = [(7 * i + 3) % 290 + 5 for i in range(30)]
GREEDY = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)


def _tokens(llm: LLM, prompt=PROMPT, params=GREEDY) -> list[int]:
    return llm.generate({"prompt_token_ids": prompt}, params)[0].outputs[0].token_ids


def test_sharded_checkpoint_reads_the_shards_its_index_names(tmp_path):
    model = make_tiny_model(tmp_path, "Qwen3", head_dim=64)
    model.save_pretrained(tmp_path, max_shard_size="100KB")  # many shards + the index
    (tmp_path / "model.safetensors").unlink(missing_ok=True)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 3
    # a stray copy in another layout, as some repositories ship beside the shards: not read
    from safetensors.torch import save_file

    save_file(
        {"tok_embeddings.weight": torch.zeros(3, 3)}, str(tmp_path / "consolidated.safetensors")
    )
    loaded = load_model(str(tmp_path))
    assert "tok_embeddings.weight" not in loaded.weights
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=8 << 20)
    assert _tokens(llm) == hf_greedy_plain(model, PROMPT, 5)[0]


def test_missing_shard_is_one_clear_error(tmp_path):
    model = make_tiny_model(tmp_path, "Qwen3", head_dim=64)
    model.save_pretrained(tmp_path, max_shard_size="100KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    (tmp_path / sorted(set(index["weight_map"].values()))[1]).unlink()
    with pytest.raises(ValueError, match="names shards that are not there"):
        load_model(str(tmp_path))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16_bit_checkpoint_matches_transformers_in_float32(tmp_path, dtype):
    make_tiny_model(tmp_path, "Gemma3Text", head_dim=64, sliding_window=8).to(
        dtype
    ).save_pretrained(tmp_path)
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    llm = LLM(str(tmp_path), dtype="float32", kv_cache_memory=8 << 20)
    assert _tokens(llm) == hf_greedy_plain(ref, PROMPT, 5)[0]


def test_gemma3_multimodal_checkpoint_serves_its_text_model(tmp_path):
    """Gemma3ForConditionalGeneration (the 4B-27B releases): the text model under
    `language_model`, its config in `text_config`; the vision tower is not read."""
    text = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, head_dim=32, sliding_window=7,
                sliding_window_pattern=3)  # fmt: skip
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2, image_size=28, patch_size=14)  # fmt: skip
    cfg = transformers.Gemma3Config(
        text_config=text, vision_config=vision, mm_tokens_per_image=4, image_token_index=299,
        boi_token_index=297, eoi_token_index=298,
    )  # fmt: skip
    model = save_multimodal_gemma3(tmp_path, cfg)
    loaded = load_model(str(tmp_path))
    assert loaded.config.architecture == "gemma3"
    assert loaded.config.family.window_layers == (True, True, False)
    assert not any("vision" in n for n in loaded.weights)
    llm = LLM(
        loaded=loaded, dtype="float32", kv_cache_memory=8 << 20, max_num_batched_tokens=16,
        max_num_seqs=4,
    )  # fmt: skip
    want = []
    ids = list(PROMPT)
    with torch.no_grad():
        for _ in range(5):
            want.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
            ids.append(want[-1])
    assert _tokens(llm) == want


@pytest.mark.parametrize("head", ["its own", "the embedding's copy"])
def test_a_tied_config_with_a_head_in_the_file_loads_as_transformers(tmp_path, head, monkeypatch):
    """`tie_word_embeddings: true` and an `lm_head.weight` in the checkpoint (a hand-edited or
    re-exported file): transformers 5 ties only when the two are equal, and otherwise keeps the
    file's head (with a warning); the engine serves what transformers computes, reading each of
    the two from the file once (the comparison's read is the one the model keeps)."""
    from safetensors.torch import load_file, save_file

    make_tiny_model(tmp_path, "Llama", tie_word_embeddings=True)
    weights = load_file(str(tmp_path / "model.safetensors"))
    embed = weights["model.embed_tokens.weight"]
    assert "lm_head.weight" not in weights  # transformers saves a tied head once
    g = torch.Generator().manual_seed(2)
    own = 3 * torch.randn(embed.shape, generator=g)
    weights["lm_head.weight"] = own if head == "its own" else embed.clone()
    save_file(weights, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    kept = not torch.equal(ref.lm_head.weight, ref.model.embed_tokens.weight)
    assert kept == (head == "its own")  # the oracle's own behaviour, checked
    from pagoda.runtime.model.safetensors_weights import SafetensorsWeights

    reads, get = [], SafetensorsWeights.__getitem__
    monkeypatch.setattr(
        SafetensorsWeights, "__getitem__", lambda w, n: reads.append(n) or get(w, n)
    )
    llm = LLM(str(tmp_path), dtype="float32", kv_cache_memory=8 << 20)
    assert reads.count("model.embed_tokens.weight") == reads.count("lm_head.weight") == 1
    assert _tokens(llm) == hf_greedy_plain(ref, PROMPT, 5)[0]
    weights["lm_head.weight"] = own[:, :-1].contiguous()  # a head transformers cannot load
    save_file(weights, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"checkpoint tensor lm_head.weight is \[300, 63\]"):
        read_model_config(str(tmp_path))


def test_generation_config_gives_eos_ids_and_sampling_defaults(tmp_path):
    model = make_tiny_model(tmp_path, "Qwen3", head_dim=64)
    greedy = hf_greedy_plain(model, PROMPT, 6)[0]
    gen = {"eos_token_id": [2, greedy[2]], "temperature": 0.6, "top_p": 0.9, "top_k": 20,
           "repetition_penalty": 1.05, "do_sample": True}  # fmt: skip
    (tmp_path / "generation_config.json").write_text(json.dumps(gen))
    loaded = load_model(str(tmp_path))
    assert loaded.config.eos_token_ids == (2, greedy[2])
    assert loaded.sampling_defaults == {
        "temperature": 0.6, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.05,
    }  # fmt: skip
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=8 << 20)
    defaults = llm.get_default_sampling_params()
    assert (defaults.temperature, defaults.top_p, defaults.top_k) == (0.6, 0.9, 20)
    assert defaults.repetition_penalty == 1.05
    # the second EOS id ends generation (it is the third greedy token)
    out = llm.generate({"prompt_token_ids": PROMPT}, SamplingParams(temperature=0, max_tokens=6))
    assert out[0].outputs[0].token_ids == greedy[:3]
    assert out[0].outputs[0].finish_reason == "stop"


def test_server_requests_take_the_generation_config_defaults(tmp_path):
    from pagoda.runtime.engine.info import EngineInfo
    from pagoda.runtime.server.completions import CompletionEndpoint
    from pagoda.runtime.server.protocol import CompletionRequest

    endpoint = CompletionEndpoint(("m",), max_batch=8)
    info = EngineInfo(
        "m", 512, 300, tokenizer=None, sampling_defaults={"temperature": 0.6, "top_k": 20}
    )
    strings = None
    left_out = endpoint.prepare(CompletionRequest(prompt=[5, 6, 7]), info, strings)
    assert (left_out.params.temperature, left_out.params.top_k) == (0.6, 20)
    given = endpoint.prepare(CompletionRequest(prompt=[5, 6], temperature=0.0), info, strings)
    assert (given.params.temperature, given.params.top_k) == (0.0, 20)


@pytest.mark.parametrize("where", ["tokenizer_config.json", "chat_template.jinja"])
def test_chat_template_from_either_file(tmp_path, where):
    make_tiny_model(tmp_path, "Qwen3", head_dim=64)
    template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    if where == "chat_template.jinja":
        (tmp_path / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": False}))
        (tmp_path / where).write_text(template)
    else:
        named = [{"name": "tool_use", "template": "x"}, {"name": "default", "template": template}]
        (tmp_path / where).write_text(json.dumps({"chat_template": named}))
    tok = load_model(str(tmp_path)).tokenizer
    assert tok.apply_chat_template([{"role": "user", "content": "w9"}]) == "<user>w9"


def test_chat_template_jinja_wins_and_bos_follows_the_post_processor(tmp_path):
    """As transformers 5 reads a directory: chat_template.jinja over tokenizer_config.json's
    template, and BOS where tokenizer.json's post-processor puts it (Llama 3, Gemma)."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers.processors import TemplateProcessing

    make_tiny_model(tmp_path, "Qwen3", head_dim=64, bos_token_id=1)
    (tmp_path / "chat_template.jinja").write_text("{{ bos_token }}{{ messages[0]['content'] }}")
    tok = load_model(str(tmp_path)).tokenizer
    assert tok.apply_chat_template([{"role": "user", "content": "w9"}]) == "w1w9"
    assert tok.encode("w5 w6") == [5, 6]  # no post-processor, no add_bos_token
    hf = HFTokenizer.from_file(str(tmp_path / "tokenizer.json"))
    hf.post_processor = TemplateProcessing(single="w1 $A", special_tokens=[("w1", 1)])
    hf.save(str(tmp_path / "tokenizer.json"))
    tok = load_model(str(tmp_path)).tokenizer
    assert tok.encode("w5 w6") == [1, 5, 6]
    assert tok.encode("w1 w5") == [1, 5]  # not twice
    assert tok.encode("w5", add_special_tokens=False) == [5]


def test_a_multimodal_checkpoints_template_files_in_transformers_order(tmp_path):
    """Gemma 3's multimodal layout: the processor's template in chat_template.json (or
    chat_template.jinja, or processor_config.json) beside tokenizer_config.json's. The engine
    renders the processor's template where transformers' processor loading finds one (its
    `get_processor_dict`), else the tokenizer's (`AutoTokenizer`), as vLLM chooses."""
    text = dict(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1, head_dim=16)  # fmt: skip
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2, image_size=28, patch_size=14)  # fmt: skip
    cfg = transformers.Gemma3Config(
        text_config=text, vision_config=vision, mm_tokens_per_image=4, image_token_index=299,
        boi_token_index=297, eoi_token_index=298,
    )  # fmt: skip
    save_multimodal_gemma3(tmp_path, cfg)

    def template(tag: str) -> str:
        return tag + "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"

    def transformers_template() -> str:
        processor, _ = transformers.ProcessorMixin.get_processor_dict(str(tmp_path))
        found = processor.get("chat_template")
        return found or transformers.AutoTokenizer.from_pretrained(tmp_path).chat_template

    layouts = [  # each file added beside the ones before it wins over them
        ("tokenizer_config.json", None, "{% for m in messages %}w3"),  # as it was saved
        ("chat_template.jinja", template("JINJA"), "JINJA"),
        ("chat_template.json", json.dumps({"chat_template": template("LEGACY")}), "LEGACY"),
        ("processor_config.json", json.dumps({"chat_template": template("PROC")}), "PROC"),
    ]
    for name, content, tag in layouts:
        if content is not None:
            (tmp_path / name).write_text(content)
        want = transformers_template()
        assert want.startswith(tag), name  # the oracle's own order, checked
        assert read_tokenizer(str(tmp_path)).chat_template == want, name
    (tmp_path / "processor_config.json").unlink()
    (tmp_path / "chat_template.jinja").unlink()  # the legacy file alone, beside the tokenizer's
    assert transformers_template().startswith("LEGACY")
    tok = read_tokenizer(str(tmp_path))
    assert tok.apply_chat_template([{"role": "user", "content": "w9"}]) == "LEGACY<user>w9"
    (tmp_path / "chat_template.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"chat_template\.json is not valid JSON"):
        read_tokenizer(str(tmp_path))


def _same_tokenizer(a, b) -> None:
    text = "w5 w6 hello <|im_end|> 日本"
    assert a.backend.to_str() == b.backend.to_str()
    assert a.encode(text) == b.encode(text) and a.encode_as_text(text) == b.encode_as_text(text)
    assert (a.chat_template, a.bos_token_id, a.eos_token_ids, a.add_bos_token) == (
        b.chat_template, b.bos_token_id, b.eos_token_ids, b.add_bos_token)  # fmt: skip


def test_read_tokenizer_is_the_tokenizer_load_model_loads(tmp_path, smol):
    """What the API process of `pagoda serve` reads while the engine process loads the model
    (`loader.read_tokenizer`): the engine's tokenizer, for a GGUF and for a directory."""
    _same_tokenizer(read_tokenizer("smollm2-135m"), smol.tokenizer)
    make_tiny_model(tmp_path, "Qwen3", head_dim=64, bos_token_id=1)
    (tmp_path / "chat_template.jinja").write_text("{{ bos_token }}{{ messages[0]['content'] }}")
    _same_tokenizer(read_tokenizer(str(tmp_path)), load_model(str(tmp_path)).tokenizer)


def test_unsupported_architecture_names_what_is_supported(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"architectures": ["T5ForConditionalGeneration"]})
    )
    with pytest.raises(ValueError, match=r"T5ForConditionalGeneration.*closest supported: ") as e:
        read_model_config(str(tmp_path))
    close = str(e.value).split("closest supported: ")[1].split(";")[0].split(", ")
    assert close and all(name in HF_ARCHITECTURES for name in close), close
    assert f"{len(HF_ARCHITECTURES)} architectures are supported" in str(e.value)
    result = subprocess.run(
        [sys.executable, "-P", "-m", "pagoda.runtime.cli", "serve", "--port", "0", "--model",
         str(tmp_path)],
        capture_output=True, text=True, timeout=180, cwd=Path(__file__).resolve().parents[3],
    )  # fmt: skip
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "unsupported architecture" in lines[0], result.stderr
    assert str(e.value) in lines[0]
