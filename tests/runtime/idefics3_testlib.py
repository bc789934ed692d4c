"""Tiny random-weight Idefics3 and SmolVLM written by transformers (a SigLIP-style tower over
32 px tiles: Idefics3's 4 px patches shuffled by 2, SmolVLM's 2 px patches shuffled by 4, 16
rows a tile either way; a 2-layer Llama of 300 tokens), saved with their processors: the
image processor (longest edge 64: at most 2x2 tiles and the global image) and a byte-level BPE
tokenizer ("\\n\\n" one token) whose `<fake_token_around_image>`, `<image>`, `<global-img>`,
`<end_of_utterance>` and `<row_r_col_c>` are added tokens, with SmolVLM's chat template.
Imported by tests (not a conftest)."""

from __future__ import annotations

import io

import numpy as np
import torch
from hf_oracle import TINY, randomize

TILE, LONGEST = 32, 64
TOKENS_PER_TILE = 16
SPECIAL = ["<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>"]
SPECIAL += [f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]
FAKE, IMAGE_ID, GLOBAL = 257, 258, 259  # (after the 256 bytes and "\n\n")
TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}"
    "{% if message['content'] is string %}{{': ' + message['content']}}{% else %}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}{% endif %}"
    "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)
# (kind, patch size, scale factor)
KINDS = {"idefics3": (4, 2), "smolvlm": (2, 4)}


def byte_chars() -> list[str]:
    """GPT-2's ByteLevel alphabet: the character standing for each byte (`bytes_to_unicode`)."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    others = [b for b in range(256) if b not in printable]
    chars = dict(zip(printable + others, printable + [256 + k for k in range(len(others))]))
    return [chr(chars[b]) for b in range(256)]


def byte_tokenizer(special: list[str], eos: str, template: str, **kw):
    """A byte-level BPE tokenizer: the 256 bytes, "\\n\\n" (256), then `special` as added
    tokens (from 257), with `template` (the tiling families' tiny checkpoints)."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {ch: i for i, ch in enumerate(byte_chars())} | {"ĊĊ": 256}
    tok = Tokenizer(models.BPE(vocab, [("Ċ", "Ċ")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(special)
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=eos, chat_template=template, **kw
    )


def _tokenizer():
    return byte_tokenizer(SPECIAL, "<end_of_utterance>", TEMPLATE)


def make_tiny(path, kind: str = "idefics3", splitting: bool = True):
    """The model (float32, eval) saved to `path` with its processor; (model, processor)."""
    import transformers

    patch, scale = KINDS[kind]
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, image_size=TILE, patch_size=patch)  # fmt: skip
    text = {**TINY, "rope_theta": 10000.0, "model_type": "llama"}
    if kind == "idefics3":
        config = transformers.Idefics3Config(vision_config=vision, text_config=text,
                                             image_token_id=IMAGE_ID, scale_factor=scale)  # fmt: skip
        cls = transformers.Idefics3ForConditionalGeneration
    else:
        config = transformers.SmolVLMConfig(vision_config=vision, text_config=text,
                                            image_token_id=IMAGE_ID, scale_factor=scale)  # fmt: skip
        cls = transformers.SmolVLMForConditionalGeneration
    torch.manual_seed(0)
    model = cls(config).eval()
    randomize(model.model.text_model, scale=4.0, seed=1)
    randomize(model.lm_head, scale=4.0, seed=1)
    randomize(model.model.vision_model, scale=1.0, seed=2)
    randomize(model.model.connector, scale=4.0, seed=3)
    model.save_pretrained(path)
    processor = make_processor(kind, splitting)
    processor.save_pretrained(path)
    return model, processor


def make_processor(kind: str, splitting: bool = True):
    """The processor of `kind`: transformers' Idefics3Processor over the family's image
    processor (SmolVLMProcessor writes the same prompt, `test_idefics3_processing.py`; it
    needs num2words and torchvision for its videos, absent here)."""
    import transformers

    return transformers.Idefics3Processor(image_processor=image_processor(kind, splitting),
                                          tokenizer=_tokenizer(), image_seq_len=TOKENS_PER_TILE,
                                          chat_template=TEMPLATE)  # fmt: skip


def image_processor(kind: str, splitting: bool = True, **kw):
    """transformers' PIL image processor of `kind` over the tiny tiles."""
    from transformers.models.idefics3.image_processing_pil_idefics3 import (
        Idefics3ImageProcessorPil,
    )
    from transformers.models.smolvlm.image_processing_pil_smolvlm import SmolVLMImageProcessorPil

    cls = Idefics3ImageProcessorPil if kind == "idefics3" else SmolVLMImageProcessorPil
    kw = {"size": {"longest_edge": LONGEST}, "max_image_size": {"longest_edge": TILE},
          "do_image_splitting": splitting, **kw}  # fmt: skip
    return cls(**kw)


def image(seed: int, size: tuple[int, int] = (40, 52), mode: str = "RGB"):
    """A random PIL image of (height, width) `size`: a 3x4 grid of random colours blown up
    smoothly, plus noise (patches that differ from image to image: the tokens tell them)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    coarse = Image.fromarray(rng.integers(0, 256, (3, 4, 3), dtype=np.uint8))
    smooth = np.asarray(coarse.resize(size[::-1], Image.BILINEAR), dtype=np.int64)
    data = np.clip(smooth + rng.integers(-20, 21, smooth.shape), 0, 255).astype(np.uint8)
    if channels == 4:
        data = np.concatenate([data, rng.integers(0, 256, (*size, 1), dtype=np.uint8)], -1)
    return Image.fromarray(data[..., 0] if channels == 1 else data, mode)


def check_chat(client, messages, ids: list[int], tokens: list[int], tokenizer, **extra) -> None:
    """A greedy chat of `messages` through the `openai` SDK reads the prompt `ids` (seen
    through vLLM's `prompt_logprobs`) and answers `tokens` (`extra`: more of its body)."""
    name = client.models.list().data[0].id
    got = client.chat.completions.create(
        model=name, messages=messages, max_tokens=len(tokens), temperature=0, logprobs=True,
        extra_body={"ignore_eos": True, "prompt_logprobs": 0, **extra},
    )  # fmt: skip
    assert got.usage.prompt_tokens == len(ids)
    prompt = got.model_extra["prompt_logprobs"]
    assert prompt[0] is None and [int(next(iter(e))) for e in prompt[1:]] == ids[1:]
    assert logprob_ids(tokenizer, got.choices[0].logprobs.content) == tokens


def png_bytes(im) -> bytes:
    out = io.BytesIO()
    im.save(out, format="PNG")
    return out.getvalue()


def image_prompt(text: str, ims: list) -> dict:
    """An offline prompt of `text` with `ims` (a plain one without images)."""
    return {"prompt": text, "multi_modal_data": {"image": ims}} if ims else {"prompt": text}


def count_encodes(llm) -> list[int]:
    """The tiles each `encode_images` call of `llm`'s model encodes, appended as it runs."""
    model, calls = llm.engine.runner.model, []
    encode = model.encode_images
    model.encode_images = lambda px: calls.append(px.shape[0]) or encode(px)
    return calls


def image_part(im) -> dict:
    """A chat content part holding `im` as a base64 PNG data URL."""
    import base64

    url = "data:image/png;base64," + base64.b64encode(png_bytes(im)).decode()
    return {"type": "image_url", "image_url": {"url": url}}


def logprob_ids(tokenizer, logprobs) -> list[int]:
    """The ids of generated tokens by their `bytes` (the tiny vocabulary's byte tokens, "\\n\\n",
    its added tokens)."""
    added, chars = tokenizer.get_added_vocab(), byte_chars()
    return [added.get(t.token) or tokenizer.convert_tokens_to_ids("".join(chars[b] for b in t.bytes))
            for t in logprobs]  # fmt: skip


def hf_inputs(processor, text: str, images: list) -> dict:
    """The processor's input_ids and pixels of `text` with `images`."""
    return processor(text=text, images=images or None, return_tensors="pt")


def hf_generate(model, inputs: dict, n: int) -> list[int]:
    """transformers' greedy tokens after the processor's `inputs`."""
    kwargs = {k: inputs[k] for k in ("pixel_values", "pixel_attention_mask") if k in inputs}
    ids = inputs["input_ids"]
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                             max_new_tokens=n, do_sample=False, **kwargs)  # fmt: skip
    return out[0, ids.shape[1] :].tolist()
