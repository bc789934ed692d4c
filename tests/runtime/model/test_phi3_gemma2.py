"""Phi-3 (`Phi3ForCausalLM`) and Gemma 2 (`Gemma2ForCausalLM`) against transformers, token for
token, on tiny random checkpoints transformers writes itself (tests/runtime/hf_oracle.py).

- Phi-3 with longrope and a partial rotary: one prompt within the original context that
  generates past it (transformers, generating with its cache, rotates the tokens past it with
  the long factors and keeps the prompt's keys short) batched in the same steps with one longer
  than the original context (long throughout); the reference is transformers' cached loop,
  whose factor choice is the one under test. Again in 16-token chunks over a warm prefix cache,
  with a long prompt that shares a short one's first block.
- Phi-3 with a sliding window, and Gemma 2 (attention and final soft caps, window layers
  alternating with global ones, four (1 + w) norms, query_pre_attn_scalar), chunked into
  16-token steps, several prompts sharing steps, then again over a warm prefix cache; prompts
  longer than the window.
- Their chat templates (Phi-3.5-mini's and Gemma 2's, from tokenizer_config.json) rendered as
  transformers renders them; a fused matrix config.json's heads do not tile refused in one
  line; the hub's older Phi-3.5 config format (rope_scaling type su) read as the new one.
"""

from __future__ import annotations

import json

import pytest
import torch
from arch_cases import check, generate
from arch_cases import prompts as shared_prompts
from hf_oracle import hf_greedy, hf_greedy_plain, make_tiny_model
from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.model.loader import load_model, read_model_config

transformers = pytest.importorskip("transformers")
NEW = 6
ORIGINAL = 32  # Phi-3's original_max_position_embeddings in the longrope case
LONGROPE = {
    "rope_type": "longrope", "rope_theta": 10000.0,
    "short_factor": [1.0 + 0.2 * i for i in range(6)],  # 6: half of 0.75 x head_dim 16
    "long_factor": [1.5 + 1.5 * i for i in range(6)],
}  # fmt: skip
PHI3_LONGROPE = dict(max_position_embeddings=128, original_max_position_embeddings=ORIGINAL,
                     rope_parameters=LONGROPE, partial_rotary_factor=0.75)  # fmt: skip
PHI3_WINDOW = dict(sliding_window=11, num_hidden_layers=3)
GEMMA2 = dict(head_dim=32, sliding_window=9, num_hidden_layers=3, query_pre_attn_scalar=48,
              attn_logit_softcapping=1.0, final_logit_softcapping=3.0)  # fmt: skip
PHI35_TEMPLATE = (  # microsoft/Phi-3.5-mini-instruct's tokenizer_config.json
    "{% for message in messages %}{% if message['role'] == 'system' and message['content'] %}"
    "{{'<|system|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}"
    "{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}"
    "{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}"
)
GEMMA2_TEMPLATE = (  # google/gemma-2-2b-it's tokenizer_config.json
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}"
    "{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\n' + "
    "message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{'<start_of_turn>model\n'}}{% endif %}"
)


def _engine(loaded, **kw) -> LLM:
    args = dict(dtype="float32", kv_cache_memory=16 << 20, block_size=16, max_num_seqs=4)
    return LLM(loaded=loaded, **{**args, **kw})


def _observed(llm: LLM, prompts: list[list[int]], n: int):
    """(tokens, per-step logits) of each prompt, all in one batch."""
    seen: dict[str, list[torch.Tensor]] = {}
    llm.engine.runner.logits_hook = lambda reqs, lg: [
        seen.setdefault(r.request_id, []).append(row.cpu()) for r, row in zip(reqs, lg.float())
    ]
    params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    return [(o.outputs[0].token_ids, seen[o.request_id]) for o in outs]


def test_phi3_longrope_switches_factors_past_the_original_context_as_transformers(tmp_path):
    model = make_tiny_model(tmp_path, "Phi3", **PHI3_LONGROPE)
    within = [(7 * i + 3) % 290 + 5 for i in range(ORIGINAL - 3)]  # crosses it while generating
    past = [(5 * i + 1) % 290 + 5 for i in range(ORIGINAL + 9)]  # past it from the start
    longer = [*within, *past[:12]]  # `within`'s first block, then past the original context
    n = 8
    want = {id(p): hf_greedy(model, p, n) for p in (within, past, longer)}
    loaded = load_model(str(tmp_path))
    assert loaded.config.rope_scaling["factor"] == 128 / ORIGINAL  # the attention factor's
    whole = _engine(loaded, max_num_batched_tokens=128)  # each prompt prefilled in one step
    for i, got in enumerate(_observed(whole, [within, past], n)):
        check(got, want[id((within, past)[i])], f"one step, prompt {i}")
    # in 16-token chunks: a long prompt's first chunks are long too; on a warm cache, the long
    # prompt does not take the short one's block (rotated short), nor the other way round
    chunked = _engine(loaded, max_num_batched_tokens=16)
    for run, prompts in enumerate(([within], [longer, past], [within, longer])):
        for p, got in zip(prompts, _observed(chunked, prompts, n)):
            check(got, want[id(p)], f"chunked, run {run}, {len(p)}-token prompt")
    assert chunked.engine.kv.prefix_hits > 0
    # the switch matters: the short factors alone give other logits past the original context
    short_only = {**LONGROPE, "long_factor": LONGROPE["short_factor"]}
    other = make_tiny_model(tmp_path / "short", "Phi3", **{**PHI3_LONGROPE,
                                                           "rope_parameters": short_only})  # fmt: skip
    assert not torch.allclose(
        hf_greedy(other, within, n)[1][-1], want[id(within)][1][-1], atol=1e-3
    )


@pytest.fixture(scope="module", params=["phi3-window", "gemma2"])
def windowed(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    arch, overrides = (
        ("Phi3", PHI3_WINDOW) if request.param == "phi3-window" else ("Gemma2", GEMMA2)
    )
    model = make_tiny_model(path, arch, **overrides)
    prompts = shared_prompts()  # two longer than the windows, two sharing a 48-token prefix
    return request.param, path, model, prompts, [hf_greedy_plain(model, p, NEW) for p in prompts]


def test_window_models_match_transformers_chunked_cached_and_batched(windowed):
    name, path, _, prompts, reference = windowed
    loaded = load_model(str(path))
    llm = _engine(loaded, max_num_batched_tokens=16)
    cold = generate(llm, prompts)
    warm = generate(llm, prompts[::-1])[::-1]
    for i, want in enumerate(reference):
        check(cold[i], want, f"{name}: prompt {i}, cold")
        check(warm[i], want, f"{name}: prompt {i}, warm")
    assert llm.engine.kv.prefix_hits > 0
    llm.engine.check_integrity()


def test_gemma2_reads_its_caps_and_alternating_windows(windowed):
    name, path, model, _, _ = windowed
    if name != "gemma2":
        pytest.skip("Gemma 2's config")
    f = read_model_config(str(path)).family
    assert (f.attn_logit_softcapping, f.final_logit_softcapping) == (1.0, 3.0)
    assert f.window_layers == (True, False, True)  # transformers' default layer_types
    assert [t == "sliding_attention" for t in model.config.layer_types] == list(f.window_layers)


@pytest.mark.parametrize(
    ("arch", "template", "messages"),
    [
        ("Phi3", PHI35_TEMPLATE, [{"role": "system", "content": "be brief"},
                                  {"role": "user", "content": "hi"}]),
        ("Gemma2", GEMMA2_TEMPLATE, [{"role": "user", "content": " hi "},
                                     {"role": "assistant", "content": "yes"},
                                     {"role": "user", "content": "and?"}]),
    ],
)  # fmt: skip
def test_chat_template_from_the_checkpoint_renders_as_transformers(
    tmp_path, arch, template, messages
):
    make_tiny_model(tmp_path, arch, num_hidden_layers=1)
    tcfg = {"chat_template": template, "bos_token": "w1", "eos_token": "w2"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(tcfg))
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    ours = load_model(str(tmp_path)).tokenizer
    for gen in (True, False):
        want = theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
        assert ours.apply_chat_template(messages, add_generation_prompt=gen) == want


def test_gemma2_template_refuses_a_system_message(tmp_path):
    make_tiny_model(tmp_path, "Gemma2", num_hidden_layers=1)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": GEMMA2_TEMPLATE}))
    ours = load_model(str(tmp_path)).tokenizer
    with pytest.raises(ValueError, match="System role not supported"):
        ours.apply_chat_template([{"role": "system", "content": "x"}])


def test_a_fused_matrix_that_does_not_match_config_is_one_line_at_config_time(tmp_path):
    """Phi-3's q/k/v widths come from config.json: a fused qkv_proj of another height is named
    before the server binds (exit 2), not split at the wrong rows."""
    make_tiny_model(tmp_path, "Phi3", num_hidden_layers=1)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["num_key_value_heads"] = 1  # q 64 + k 16 + v 16 rows; the file has 128
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"qkv_proj.weight has 128 rows; .* need 96$"):
        read_model_config(str(tmp_path))


def test_phi35s_older_config_format_reads_as_transformers_reads_it(tmp_path):
    """The hub's Phi-3.5-mini config.json (transformers 4's format): `rope_scaling` of type su
    (or longrope), rope_theta and partial_rotary_factor at the top level; the same rotary as
    the format transformers 5 writes, and transformers reads it as longrope too."""
    from pagoda.runtime.model.ops import build_cos_sin_cache

    make_tiny_model(tmp_path, "Phi3", num_hidden_layers=1, **PHI3_LONGROPE)
    new = read_model_config(str(tmp_path))
    cfg = json.loads((tmp_path / "config.json").read_text())
    rope = cfg.pop("rope_parameters")
    cfg.update(rope_theta=rope.pop("rope_theta"),
               partial_rotary_factor=rope.pop("partial_rotary_factor"))  # fmt: skip
    rope.pop("rope_type")
    cfg["rope_scaling"] = {**rope, "type": "su"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    old = read_model_config(str(tmp_path))
    assert (
        transformers.AutoConfig.from_pretrained(tmp_path).rope_parameters["rope_type"] == "longrope"
    )
    tables = [build_cos_sin_cache(c.head_dim, c.rope_theta, c.rope_scaling, 64) for c in (old, new)]
    assert tables[0].shape == (128, 12)  # short rows, then long; 12 of 16 dims rotate
    assert torch.equal(*tables)


def test_an_fp8_phi3_checkpoint_is_refused_in_one_line(tmp_path):
    """Its scales belong to the fused matrices, which the loader lists as their parts."""
    from safetensors.torch import load_file, save_file

    make_tiny_model(tmp_path, "Phi3", num_hidden_layers=1)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    tensors["model.layers.0.self_attn.qkv_proj.weight_scale"] = torch.ones(1)
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"FP8 Phi-3 checkpoints .* are not supported$"):
        read_model_config(str(tmp_path))
