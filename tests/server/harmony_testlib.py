"""gpt-oss's chat template condensed (the same constructs: a system message reading
`reasoning_effort`, the tools as a `functions` namespace in a developer message (each with
``"// " + description``, which fails without one), a past call's `thinking` as its analysis and
the call as
``<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>ARGS<|call|>``, a
tool result as ``<|start|>functions.NAME to=assistant<|channel|>commentary<|message|>…``, the
reply opened with ``<|start|>assistant``), and a tiny gpt-oss checkpoint steered to write one
harmony reply: an analysis message, then a call to `get_weather`."""

from __future__ import annotations

import itertools
import json

TEMPLATE = (
    "{%- set ns = namespace(last='') %}"
    # (in a macro, as gpt-oss's: the variable is read before it may be set)
    "{%- macro system() -%}{%- if reasoning_effort is not defined %}"
    "{%- set reasoning_effort = 'medium' %}{%- endif %}"
    "{{- 'Reasoning: ' + reasoning_effort }}{%- endmacro -%}"
    "<|start|>system<|message|>{{ system() }}<|end|>"
    "{%- if tools %}<|start|>developer<|message|># Tools\nnamespace functions {\n"
    "{%- for t in tools %}{{- '// ' + t.function.description + '\n' }}type {{ t.function.name }}"
    " = (_: {{ t.function.parameters | tojson }}) => any;\n{% endfor %}} // namespace functions"
    "<|end|>{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and m.tool_calls %}"
    "{%- set c = m.tool_calls[0].function %}"
    "{%- if m.thinking %}"
    "{{- '<|start|>assistant<|channel|>analysis<|message|>' + m.thinking + '<|end|>' }}"
    "{%- endif %}"
    "{{- '<|start|>assistant to=functions.' + c.name + '<|channel|>commentary json<|message|>'"
    " + c.arguments | tojson + '<|call|>' }}"
    "{%- set ns.last = c.name %}"
    "{%- elif m.role == 'tool' %}"
    "{{- '<|start|>functions.' + ns.last + ' to=assistant<|channel|>commentary<|message|>'"
    " + m.content | tojson + '<|end|>' }}"
    "{%- elif m.role == 'assistant' %}"
    "{{- '<|start|>assistant<|channel|>final<|message|>' + m.content + '<|end|>' }}"
    "{%- else %}{{- '<|start|>' + m.role + '<|message|>' + m.content + '<|end|>' }}{%- endif %}"
    "{%- endfor %}"
    # (a space before the reply's header: the steered model's tokenizer splits on whitespace)
    "{%- if add_generation_prompt %} <|start|>assistant{% endif %}"
)

# the steered model's vocabulary: each token's successor is fixed (a bigram chain), starting
# from the prompt's last token; "<|call|>" and "<|return|>" are the EOS ids, as gpt-oss's
CHAIN = [
    "<|start|>assistant",
    "<|channel|>analysis<|message|>",
    "Need the weather.",
    "<|end|>",
    "<|start|>assistant<|channel|>commentary",
    " to=functions.get_weather ",
    "<|constrain|>json",
    "<|message|>",
    '{"city": ',
    '"Paris"}',
    "<|call|>",
    "never written",  # what follows <|call|>, were it not a stop token
]
VOCAB = ["<unk>", *CHAIN, "<|return|>"]
REASONING, ARGUMENTS = "Need the weather.", '{"city": "Paris"}'


def write_steered_gpt_oss(path) -> None:
    """A GptOssForCausalLM whose layers add nothing (output projections zero) and whose
    embeddings and head make a bigram chain: `CHAIN[i]` → `CHAIN[i + 1]`."""
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    ids = {t: i for i, t in enumerate(VOCAB)}
    eos = [ids["<|return|>"], ids["<|call|>"]]
    hidden = 64
    config = transformers.GptOssConfig(
        vocab_size=len(VOCAB), hidden_size=hidden, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, num_local_experts=2,
        num_experts_per_tok=1, sliding_window=16, layer_types=["full_attention"],
        max_position_embeddings=512, eos_token_id=eos, bos_token_id=None, pad_token_id=0,
        tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.GptOssForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.self_attn.o_proj.bias.zero_()
            layer.mlp.experts.down_proj.zero_()
            layer.mlp.experts.down_proj_bias.zero_()
        model.model.norm.weight.fill_(1.0)
        model.model.embed_tokens.weight.copy_(torch.eye(len(VOCAB), hidden))
        head = torch.zeros(len(VOCAB), hidden)
        for a, b in itertools.pairwise(CHAIN):
            head[ids[b], ids[a]] = 1.0
        head[ids["never written"], [ids["<unk>"], ids["<|return|>"], ids["never written"]]] = 1.0
        model.lm_head.weight.copy_(head)
    model.save_pretrained(path)
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    tok = Tokenizer(models.WordLevel(ids, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.Fuse()  # the tokens' text as written, no spaces between
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
