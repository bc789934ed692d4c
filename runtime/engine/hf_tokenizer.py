"""What `LLM.get_tokenizer()` hands back: the runtime's tokenizer behind the Hugging Face calls
that scripts written for vLLM make on it (vLLM returns a transformers tokenizer), with Hugging
Face's defaults: `decode` keeps special tokens, `apply_chat_template` tokenizes and adds no
generation prompt unless asked. Only these calls exist; any other is an AttributeError, not a
silent stand-in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pagoda.runtime.model.tokenizer import Tokenizer

# transformers' apply_chat_template options that would change what it returns
UNSERVED = frozenset({"chat_template", "documents", "padding", "truncation", "max_length",
                      "return_tensors", "return_dict", "return_assistant_tokens_mask",
                      "tokenizer_kwargs"})  # fmt: skip


class HFTokenizer:
    """`encode`, `decode`, `__call__`, `apply_chat_template`, `convert_ids_to_tokens`,
    `convert_tokens_to_ids`, `get_vocab`, `len()`, the BOS/EOS tokens and `chat_template`."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer  # the runtime's own (what the engine encodes with)
        self.chat_template = tokenizer.chat_template
        # as transformers': the tokens tokenizer_config.json names, else config.json's ids
        self.bos_token = tokenizer.bos_token or None
        self.eos_token = tokenizer.eos_token or None
        self.bos_token_id = self._id(self.bos_token, tokenizer.bos_token_id)
        eos_id = tokenizer.eos_token_ids[0] if tokenizer.eos_token_ids else None
        self.eos_token_id = self._id(self.eos_token, eos_id)

    def _id(self, token: str | None, default: int | None) -> int | None:
        if token is None:
            return None
        found = self.tokenizer.backend.token_to_id(token)
        return default if found is None else found

    def __len__(self) -> int:
        return self.tokenizer.vocab_size

    def get_vocab(self) -> dict[str, int]:
        return self.tokenizer.backend.get_vocab(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def __call__(self, text: str | Sequence[str], add_special_tokens: bool = True) -> Encoding:
        """`input_ids` and `attention_mask` (keys and attributes, as transformers' BatchEncoding)
        for a text, or lists of them for a list of texts."""
        if isinstance(text, str):
            ids = self.encode(text, add_special_tokens)
            return Encoding(input_ids=ids, attention_mask=[1] * len(ids))
        ids_list = [self.encode(t, add_special_tokens) for t in text]
        return Encoding(input_ids=ids_list, attention_mask=[[1] * len(i) for i in ids_list])

    def decode(self, token_ids: int | Sequence[int], skip_special_tokens: bool = False) -> str:
        ids = [token_ids] if isinstance(token_ids, int) else list(token_ids)
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, ids: int | Sequence[int]) -> str | list[str | None] | None:
        if isinstance(ids, int):
            return self.tokenizer.token_to_str(ids)
        return [self.tokenizer.token_to_str(i) for i in ids]

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> int | list[int | None] | None:
        backend = self.tokenizer.backend
        if isinstance(tokens, str):
            return backend.token_to_id(tokens)
        return [backend.token_to_id(t) for t in tokens]

    def apply_chat_template(
        self,
        conversation: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = False,
        continue_final_message: bool = False,
        tokenize: bool = True,
        **template_kwargs: Any,
    ) -> str | list[int]:
        """The conversation rendered by the model's chat template (ids unless ``tokenize=False``,
        as transformers'); other keyword arguments are template variables, except transformers'
        own options this does not serve (`return_dict`, `chat_template`, ...): a ValueError."""
        unserved = sorted(k for k in template_kwargs if k in UNSERVED)
        if unserved:
            raise ValueError(f"apply_chat_template: {', '.join(unserved)} not supported here")
        text = self.tokenizer.apply_chat_template(
            conversation,
            add_generation_prompt=add_generation_prompt,
            tools=tools,
            continue_final_message=continue_final_message,
            variables=template_kwargs,
        )
        return self.tokenizer.encode(text, add_special_tokens=False) if tokenize else text


class Encoding(dict):
    """What calling the tokenizer returns: a dict whose keys read as attributes too."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None
