"""A tokenizer with named chat templates (Command R's, Command R+'s, Aya's and Hermes 2 Pro's
`tokenizer_config.json`: ``default``, ``tool_use``, ``rag``): a chat with tools renders the
``tool_use`` one, as transformers' `get_chat_template` and vLLM choose it, and one without tools
the ``default``; the oracle is transformers' `apply_chat_template` on the same directory."""

from __future__ import annotations

import json
import pickle

import pytest
import structured_testlib
from hf_oracle import make_tiny_model
from pagoda.runtime.engine.info import EngineInfo
from pagoda.runtime.model.loader import load_model
from pagoda.runtime.server.chat import ChatEndpoint
from pagoda.runtime.server.protocol import ChatCompletionRequest
from pagoda.runtime.server.serving import TokenStrings

transformers = pytest.importorskip("transformers")

TURNS = (
    "{% for message in loop_messages %}{% if message['role'] == 'user' %}"
    "{{ '<|START_OF_TURN_TOKEN|><|USER_TOKEN|>' + message['content'] + '<|END_OF_TURN_TOKEN|>' }}"
    "{% elif message['role'] == 'assistant' %}"
    "{{ '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' + message['content'] + '<|END_OF_TURN_TOKEN|>' }}"
    "{% endif %}{% endfor %}"
)
DEFAULT = (  # c4ai-command-r-v01's default template, its system preamble left out
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% if system_message != false %}"
    "{{ '<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>' + system_message + '<|END_OF_TURN_TOKEN|>' }}"
    "{% endif %}" + TURNS + "{% if add_generation_prompt %}"
    "{{ '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' }}{% endif %}"
)
TOOL_USE = (  # its tool_use template's shape: the tools as Python signatures in the preamble
    "{{ bos_token }}{% set loop_messages = messages %}"
    "{{ '<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|># System Preamble\\n## Available Tools\\n' }}"
    "{% for tool in tools %}{% set fn = tool.function %}"
    "{{ '```python\\ndef ' + fn.name + '(' }}{% for name, p in fn.parameters.properties.items() %}"
    "{% if not loop.first %}, {% endif %}{{ name }}: {{ p.type }}{% endfor %}"
    '{{ \') -> List[Dict]:\\n    """\' + fn.description + \'"""\\n```\\n\' }}{% endfor %}'
    "{{ '<|END_OF_TURN_TOKEN|>' }}" + TURNS + "{{ '<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>"
    "Write \\'Action:\\' followed by a json-formatted list of actions<|END_OF_TURN_TOKEN|>' }}"
    "{% if add_generation_prompt %}{{ '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' }}{% endif %}"
)
TOOLS = [{"type": "function", "function": {
    "name": "internet_search", "description": "Returns a list of relevant document snippets",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}}]  # fmt: skip
ASK = [{"role": "user", "content": "Whats the biggest penguin in the world?"}]
SPECIALS = ("<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>", "<|START_OF_TURN_TOKEN|>", "<|USER_TOKEN|>",
            "<|CHATBOT_TOKEN|>", "<|SYSTEM_TOKEN|>")  # fmt: skip


@pytest.fixture(scope="module")
def command_r(tmp_path_factory):
    from tokenizers import AddedToken

    path = tmp_path_factory.mktemp("command-r")
    backend = structured_testlib.smol_tokenizer().backend
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in SPECIALS])
    bos, eot = backend.token_to_id("<BOS_TOKEN>"), backend.token_to_id("<|END_OF_TURN_TOKEN|>")
    make_tiny_model(path, "Cohere", vocab_size=backend.get_vocab_size(), hidden_size=32,
                    intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                    num_key_value_heads=2, bos_token_id=bos, eos_token_id=eot)  # fmt: skip
    backend.save(str(path / "tokenizer.json"))
    named = [{"name": "default", "template": DEFAULT}, {"name": "tool_use", "template": TOOL_USE},
             {"name": "rag", "template": DEFAULT}]  # fmt: skip
    (path / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": named, "bos_token": "<BOS_TOKEN>", "eos_token": "<|END_OF_TURN_TOKEN|>",
        "add_bos_token": True, "tokenizer_class": "PreTrainedTokenizerFast"}))  # fmt: skip
    return path, load_model(str(path)).tokenizer


def _served(tok, body: dict) -> list[int]:
    info = EngineInfo("command-r", 8192, tok.vocab_size, tok)
    req = ChatCompletionRequest.model_validate({"messages": ASK, **body})
    return ChatEndpoint(("command-r",)).prepare(req, info, TokenStrings(tok)).prompts[0]


@pytest.mark.parametrize("tools", [None, TOOLS])
def test_a_chat_with_tools_renders_the_tool_use_template(command_r, tools):
    path, tok = command_r
    theirs = transformers.AutoTokenizer.from_pretrained(path)
    want = theirs.apply_chat_template(ASK, tools=tools, add_generation_prompt=True, tokenize=True)
    want = list(want["input_ids"] if hasattr(want, "keys") else want)
    body = {"tools": tools, "tool_choice": "none"} if tools else {}  # no parser reads its calls
    assert _served(tok, body) == want
    assert ("def internet_search(query: string)" in tok.decode(want)) == bool(tools)
    again = pickle.loads(pickle.dumps(tok))  # as the engine process hands it to the server
    assert again.apply_chat_template(ASK, tools=tools) == theirs.apply_chat_template(
        ASK, tools=tools, add_generation_prompt=True, tokenize=False
    )
