"""The byte-table stream decoder gives exactly DecodeStream's output, token by token."""

from __future__ import annotations

import random

import pytest
from pagoda.runtime.model.byte_stream import ByteStream, byte_pieces, is_plain_byte_level
from tokenizers.decoders import DecodeStream

TEXT = " naïve café 日本語 🙂 Ünïcödé ✓ <|im_end|> done.\n\tcode: x = [1, 2]; # ok"


def steps(step, ids):
    return [step(t) for t in ids]


def rust_steps(hf, ids, context, skip):
    stream = DecodeStream(skip_special_tokens=skip, ids=list(context))
    return steps(lambda t: stream.step(hf, t), ids)


@pytest.mark.parametrize("skip", [True, False])
def test_same_steps_as_decode_stream_on_text_and_random_ids(smol, skip):
    tok = smol.tokenizer
    hf = tok._tok
    assert is_plain_byte_level(hf)
    pieces = byte_pieces(hf, skip)
    rng = random.Random(0)
    specials = list(hf.get_added_tokens_decoder())
    # Real text, random ids (split characters, invalid bytes) and special tokens mixed in.
    cases = [tok.encode(TEXT), tok.encode(TEXT * 3)[7:]]
    cases += [[rng.randrange(len(pieces)) for _ in range(200)] for _ in range(5)]
    cases += [[rng.choice(specials + tok.encode("日本🙂")) for _ in range(100)]]
    cases += [[*tok.encode("a 日"), len(pieces) + 5, *tok.encode("本 b")]]  # past the vocab
    for ids in cases:
        context = tok.encode("Hello there")
        ours = ByteStream.after(pieces, context)
        assert ours is not None
        assert steps(ours.step, ids) == rust_steps(hf, ids, context, skip)


def test_context_ending_mid_character_is_the_prompts_own(smol):
    """A context ending in part of a character: those bytes stay the prompt's, and the output's
    first bytes read on their own, as decoding the output does (both streams); the prompt's
    text is never handed out again with them."""
    tok = smol.tokenizer
    pieces = byte_pieces(tok._tok, True)
    emoji = tok.encode("🙂🎉 ok")
    assert len(emoji) > 2  # 4-byte characters spread over byte tokens
    context, out = tok.encode("Hello") + emoji[:1], emoji[1:]
    want = tok.decode(out)
    ours = ByteStream.after(pieces, context)
    assert "".join(c or "" for c in steps(ours.step, out)) == want
    rust = DecodeStream(skip_special_tokens=True, ids=tok.clean_context(context))
    assert "".join(c or "" for c in steps(lambda t: rust.step(tok._tok, t), out)) == want
    assert isinstance(tok.stream_decoder(context).__self__, ByteStream)


def test_skipped_specials_add_nothing_and_kept_ones_their_text(smol):
    hf = smol.tokenizer._tok
    special = next(i for i, t in hf.get_added_tokens_decoder().items() if t.special)
    assert byte_pieces(hf, True)[special] == b""
    assert byte_pieces(hf, False)[special] == hf.id_to_token(special).encode()


def test_only_a_plain_byte_level_decoder_is_plain():
    """A ByteLevel decoder alone is; one inside a Sequence, another decoder, or none is not."""
    from tokenizers import Tokenizer, decoders, models

    def with_decoder(decoder):
        tok = Tokenizer(models.BPE())
        if decoder is not None:
            tok.decoder = decoder
        return tok

    assert is_plain_byte_level(with_decoder(decoders.ByteLevel()))
    assert not is_plain_byte_level(with_decoder(decoders.Sequence([decoders.ByteLevel()])))
    assert not is_plain_byte_level(with_decoder(decoders.Metaspace()))
    assert not is_plain_byte_level(with_decoder(None))
