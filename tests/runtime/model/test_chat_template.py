"""Chat templates render as transformers renders them (the oracle): the tags, extensions and
globals of its Jinja environment that models' templates use. Before, `strftime_now` was missing
(Llama 3.2's template then wrote its fixed fallback date, not today's), and `{% break %}` /
`{% generation %}` made a template fail to compile at all."""

from __future__ import annotations

import datetime

import pytest
import structured_testlib
from pagoda.runtime.model.tokenizer import Tokenizer
from transformers import PreTrainedTokenizerFast

# as Llama 3.2's template writes the date (its fallback: a date fixed in the template)
DATED = (
    '{%- if strftime_now is defined %}{%- set date_string = strftime_now("%d %b %Y") %}'
    '{%- else %}{%- set date_string = "26 Jul 2024" %}{%- endif %}'
    "Today Date: {{ date_string }}\n"
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
)
# the last user message only: a loop left with `{% break %}`, `{% continue %}` over the others
LAST_USER = (
    "{% for m in messages | reverse %}{% if m.role != 'user' %}{% continue %}{% endif %}"
    "[{{ m.content }}]{% break %}{% endfor %}"
)
# transformers marks the assistant's text with `{% generation %}` (to train on it)
GENERATION = (
    "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}A: {{ m.content }}"
    "{% endgeneration %}{% else %}U: {{ m.content }}{% endif %}\n{% endfor %}"
)
MESSAGES = [{"role": "user", "content": "one"}, {"role": "assistant", "content": "two"},
            {"role": "user", "content": "three"}, {"role": "assistant", "content": "four"}]  # fmt: skip


@pytest.fixture(scope="module")
def tok():
    return structured_testlib.smol_tokenizer()


@pytest.mark.parametrize("template", [DATED, LAST_USER, GENERATION])
def test_rendered_as_transformers_renders_it(tok, template):
    ours = Tokenizer(tok.backend, chat_template=template, bos_token_id=None, eos_token_ids=[2])
    hf = PreTrainedTokenizerFast(tokenizer_object=tok.backend, chat_template=template)
    want = hf.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=False)
    assert ours.apply_chat_template(MESSAGES, add_generation_prompt=False) == want


def test_the_date_is_today(tok):
    ours = Tokenizer(tok.backend, chat_template=DATED, bos_token_id=None, eos_token_ids=[2])
    text = ours.apply_chat_template(MESSAGES[:1])
    assert datetime.datetime.now().strftime("%d %b %Y") in text
