"""A tiny random-weight Gemma 3 with images written by transformers (SigLIP tower 48 px, 8 px
patches: a 6x6 grid pooled to 9 rows an image; a 2-layer Gemma 3 text model of 300 tokens, a
sliding-window layer of 12 keys and a global one), saved with its processor: a
Gemma3ImageProcessor and a word-level tokenizer whose newline runs are tokens ("\\n" 290,
"\\n\\n" 291, "\\n\\n\\n" 292) and whose <start_of_image> (295), <end_of_image> (296) and
<image_soft_token> (297) are special tokens, with a Gemma-style chat template over content
parts. Imported by tests (not a conftest)."""

from __future__ import annotations

import torch
from hf_oracle import randomize

BOI, EOI, IMAGE_ID = 295, 296, 297
NL = (290, 291, 292)  # "\n", "\n\n", "\n\n\n"
TOKENS_PER_IMAGE = 9
WINDOW = 12
TEMPLATE = (
    "{% for message in messages %}{{ '<start_of_turn>' + message['role'] + '\n' }}"
    "{% for content in message['content'] %}{% if content['type'] == 'image' %}"
    "{{ '<start_of_image>' }}{% else %}{{ content['text'] }}{% endif %}{% endfor %}"
    "{{ '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)


def expanded(ids: list[int]) -> list[int]:
    """`ids` with each <start_of_image> as transformers' Gemma3Processor writes it (over ids
    that hold no newline beside it)."""
    run = [NL[1], BOI, *[IMAGE_ID] * TOKENS_PER_IMAGE, EOI, NL[1]]
    return [t for i in ids for t in (run if i == BOI else [i])]


def make_tiny_gemma3(path):
    """The model (float32, eval) saved to `path` with its processor; (model, processor)."""
    import transformers
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    vision = transformers.SiglipVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        image_size=48, patch_size=8, vision_use_head=False,
    )  # fmt: skip
    text = transformers.Gemma3TextConfig(
        vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16,
        sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"],
        max_position_embeddings=512, eos_token_id=2, bos_token_id=1, pad_token_id=0,
        tie_word_embeddings=False,
    )  # fmt: skip
    config = transformers.Gemma3Config(
        vision_config=vision, text_config=text, mm_tokens_per_image=TOKENS_PER_IMAGE,
        boi_token_index=BOI, eoi_token_index=EOI, image_token_index=IMAGE_ID,
        tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Gemma3ForConditionalGeneration(config).eval()
    randomize(model.model.language_model, scale=4.0, seed=1)
    randomize(model.lm_head, scale=4.0, seed=4)
    randomize(model.model.vision_tower, scale=1.0, seed=2)
    randomize(model.model.multi_modal_projector, seed=3)  # (its matrix starts at zeros)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        model.model.multi_modal_projector.mm_input_projection_weight.normal_(0, 0.1, generator=g)
    model.save_pretrained(path)
    specials = {"<start_of_image>": BOI, "<end_of_image>": EOI, "<image_soft_token>": IMAGE_ID,
                "<start_of_turn>": 293, "<end_of_turn>": 294}  # fmt: skip
    vocab = {f"w{i}": i for i in range(290)} | {"\n" * (k + 1): t for k, t in enumerate(NL)}
    vocab |= specials | {"user": 298, "model": 299}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex("\n+"), "isolated"),
        pre_tokenizers.Split(" ", "removed"),
    ])  # fmt: skip
    tok.add_special_tokens(list(specials))
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="w1", eos_token="w2", unk_token="w0", pad_token="w0",
        extra_special_tokens={"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
                              "image_token": "<image_soft_token>"},
    )  # fmt: skip
    images = transformers.Gemma3ImageProcessor(size={"height": 48, "width": 48})
    processor = transformers.Gemma3Processor(
        image_processor=images, tokenizer=fast, chat_template=TEMPLATE,
        image_seq_length=TOKENS_PER_IMAGE,
    )  # fmt: skip
    processor.save_pretrained(path)
    return model, processor


def hf_generate(model, processor, ids: list[int], images: list, n: int) -> list[int]:
    """transformers' greedy tokens after the expanded prompt `ids` with `images`' pixels (the
    images' tokens attend both ways: token_type_ids)."""
    kwargs = {}
    if images:
        kwargs["pixel_values"] = processor.image_processor(images, return_tensors="pt")[
            "pixel_values"
        ]
        kwargs["token_type_ids"] = (torch.tensor([ids]) == IMAGE_ID).long()
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([ids]), max_new_tokens=n, do_sample=False,
                             **kwargs)  # fmt: skip
    return out[0, len(ids) :].tolist()
