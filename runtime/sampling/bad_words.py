"""vLLM's `bad_words`: words a request's output must not contain, as token-id sequences.

Each word is tokenized twice, as vLLM does (`SamplingParams.update_from_tokenizer`): as written
(leading spaces stripped), and with one leading space, which is kept where it makes a different
first token and the same number of tokens (so a word is banned at the start of the text and
after a space). A word's last token is banned (-inf) at a step where the output's last tokens
are the word's earlier tokens; a one-token word is banned always. As in vLLM only the output
is matched, never the prompt.

The bans ride on `LogitBias` (its -inf entries, per row, with the bias and min_tokens): rows
that ask build their entries from their own output, rows that do not cost nothing. A row with
a word of several tokens changes its entries with every token, so its batch rebuilds them each
step (`LogitBias.live`) and, under async scheduling, its steps run synchronously (they need the
token sampled last, as penalties do).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

BadWords = tuple[tuple[int, ...], ...]


def bad_words_token_ids(words: Sequence[str], tokenizer: Any, vocab_size: int) -> BadWords:
    """The token-id sequences of `words` (vLLM's rule); ValueError naming `bad_words` for an
    id outside the model's vocabulary."""
    out: list[tuple[int, ...]] = []
    for word in words:
        for spaced in (False, True):
            ids = tuple(tokenizer.encode((" " if spaced else "") + word.lstrip(),
                                         add_special_tokens=False))  # fmt: skip
            if not ids:
                continue
            if not spaced or (out and ids[0] != out[-1][0] and len(ids) == len(out[-1])):
                out.append(ids)
    bad = sorted({t for ids in out for t in ids if not 0 <= t < vocab_size})
    if bad:
        raise ValueError(f"bad_words: token ids {bad[:10]} are outside this model's vocabulary "
                         f"[0, {vocab_size})")  # fmt: skip
    return tuple(dict.fromkeys(out))


def banned_now(words: BadWords, output: Sequence[int]) -> set[int]:
    """The tokens that would complete one of `words` after `output` (the output tokens)."""
    banned = set()
    n = len(output)
    for ids in words:
        k = len(ids) - 1
        if k == 0 or (k <= n and tuple(output[n - k :]) == ids[:-1]):
            banned.add(ids[-1])
    return banned


def needs_history(words: BadWords) -> bool:
    """Whether some word has several tokens (its ban depends on the output so far)."""
    return any(len(ids) > 1 for ids in words)
