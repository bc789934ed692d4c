"""Tiny embedding checkpoints in the published Qwen3-Embedding layout and BERT's (an encoder
with a WordPiece tokenizer), and transformers' vectors as the oracle (imported by tests; not a
conftest)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

_MODES = {"LAST": "pooling_mode_lasttoken", "MEAN": "pooling_mode_mean_tokens",
          "CLS": "pooling_mode_cls_token"}  # fmt: skip


def make_embedding_model(path, arch: str = "Qwen3", pooling: str = "LAST", normalize=True,
                         **config_json):  # fmt: skip
    """A tiny random `arch` decoder written by transformers (architectures
    [`arch`ForCausalLM]) plus sentence-transformers' modules.json, 1_Pooling/config.json and
    (with `normalize`) the Normalize module, a left padding side as Qwen3-Embedding's;
    `config_json`: keys added to config.json (Matryoshka's). Returns the transformers model."""
    from hf_oracle import make_tiny_model

    model = make_tiny_model(path, arch)
    path = Path(path)
    write_sentence_transformers(path, pooling, normalize, model.config.hidden_size)
    # Qwen3-Embedding's tokenizer.json appends its <|endoftext|> (here w2) to every text, the row
    # LAST pooling reads
    from tokenizers import Tokenizer, processors

    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    tok.post_processor = processors.TemplateProcessing(single="$A w2", special_tokens=[("w2", 2)])
    tok.save(str(path / "tokenizer.json"))
    tok_cfg = path / "tokenizer_config.json"
    cfg = json.loads(tok_cfg.read_text()) if tok_cfg.exists() else {}
    tok_cfg.write_text(json.dumps({**cfg, "padding_side": "left"}))
    if config_json:
        c = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps({**c, **config_json}))
    return model


def write_sentence_transformers(path: Path, pooling: str, normalize: bool, hidden: int) -> None:
    """sentence-transformers' modules.json, 1_Pooling/config.json (`pooling`: LAST, MEAN, CLS)
    and, with `normalize`, the Normalize module, beside a checkpoint at `path`."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling"}]  # fmt: skip
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize"})  # fmt: skip
        (path / "2_Normalize").mkdir()
    (path / "modules.json").write_text(json.dumps(modules))
    (path / "1_Pooling").mkdir()
    pool = {m: m == _MODES[pooling] for m in _MODES.values()}
    (path / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": hidden, **pool})
    )


# BERT's vocabulary of the tiny encoders: its special tokens, then w0 .. w90
WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(91)]
ENCODER_SIZES = dict(vocab_size=len(WORDS), hidden_size=32, num_hidden_layers=2,
                     num_attention_heads=2, intermediate_size=64)  # fmt: skip


def save_wordpiece_tokenizer(path: Path) -> None:
    """BERT's WordPiece tokenizer over `WORDS`: lower-cased, [CLS] text [SEP]."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    tok = Tokenizer(models.WordPiece({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.BertProcessing(("[SEP]", 3), ("[CLS]", 2))
    tok.save(str(path / "tokenizer.json"))


def make_bert_model(path: Path, pooling: str = "MEAN"):
    """A tiny random `BertModel` (64 positions) written by transformers with its tensors under
    `bert.` (as BertForMaskedLM's and older sentence-transformers checkpoints store them), the
    WordPiece tokenizer and sentence-transformers' `pooling`, normalized. Returns the model."""
    import transformers
    from hf_oracle import randomize
    from safetensors.torch import load_file, save_file

    torch.manual_seed(0)
    cfg = transformers.BertConfig(**ENCODER_SIZES, max_position_embeddings=64)
    model = randomize(transformers.BertModel(cfg).eval(), scale=1.0)
    model.save_pretrained(path)
    stored = load_file(path / "model.safetensors")
    save_file({f"bert.{k}": v for k, v in stored.items()}, path / "model.safetensors")
    save_wordpiece_tokenizer(path)
    write_sentence_transformers(path, pooling, True, cfg.hidden_size)
    return model


def hf_encoder_embeddings(model, prompts: list[list[int]], pooling: str):
    """An encoder's vectors by transformers: one right-padded batch with its attention mask,
    the last hidden states pooled (CLS or MEAN) and normalized, float32 numpy [N, hidden]."""
    n = max(map(len, prompts))
    ids = torch.tensor([p + [0] * (n - len(p)) for p in prompts])
    mask = torch.tensor([[1] * len(p) + [0] * (n - len(p)) for p in prompts])
    with torch.no_grad():
        h = model(input_ids=ids, attention_mask=mask).last_hidden_state
    m = mask.unsqueeze(-1).float()
    out = h[:, 0] if pooling == "CLS" else (h * m).sum(1) / m.sum(1)
    return F.normalize(out, dim=-1).numpy()


def hf_embeddings(model, prompts: list[list[int]], pooling: str, normalize=True) -> torch.Tensor:
    """transformers' vectors: one left-padded batch (as Qwen3-Embedding is run), the final-norm
    hidden states pooled as sentence-transformers pools them, float32 [N, hidden]."""
    n = max(map(len, prompts))
    ids = torch.tensor([[0] * (n - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (n - len(p)) + [1] * len(p) for p in prompts])
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        h = model.model(input_ids=ids, attention_mask=mask, position_ids=positions)
    h = h.last_hidden_state.float()
    if pooling == "LAST":
        out = h[:, -1]
    elif pooling == "CLS":
        out = h[torch.arange(len(prompts)), n - torch.tensor(list(map(len, prompts)))]
    else:
        m = mask.unsqueeze(-1).float()
        out = (h * m).sum(1) / m.sum(1)
    return F.normalize(out, dim=-1) if normalize else out


def make_cross_encoder(path: Path, kind: str = "Bert", **labels):
    """A tiny random `<kind>ForSequenceClassification` of one label (a cross-encoder reranker:
    ms-marco-MiniLM's BERT, bge-reranker's XLM-RoBERTa; `labels`: config keys for a classifier
    of several, id2label, problem_type) with the WordPiece tokenizer, its head scaled so that
    pairs' scores differ. Returns the model."""
    import transformers
    from hf_oracle import randomize

    torch.manual_seed(0)
    positions = 64 if kind == "Bert" else 66  # (XLM-R's table: 2 offset rows)
    cfg = getattr(transformers, f"{kind}Config")(**ENCODER_SIZES, max_position_embeddings=positions,
                                                 **(labels or {"num_labels": 1}))  # fmt: skip
    model = randomize(getattr(transformers, f"{kind}ForSequenceClassification")(cfg).eval())
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "classifier" in name and p.dim() > 1:
                p.mul_(30)
    model.save_pretrained(path)
    save_wordpiece_tokenizer(path)
    return model


def hf_pair_scores(model, path: Path, query: str, docs: list[str], types: bool = True):
    """transformers' scores of (query, doc) pairs: the tokenizer's pair encoding (its token
    types where `types`, else zeros), sigmoid of the one logit (CrossEncoder's default), float64
    numpy [N]."""
    from tokenizers import Tokenizer

    encs = [Tokenizer.from_file(str(path / "tokenizer.json")).encode(query, d) for d in docs]
    n = max(len(e.ids) for e in encs)
    ids = torch.tensor([e.ids + [0] * (n - len(e.ids)) for e in encs])
    mask = torch.tensor([[1] * len(e.ids) + [0] * (n - len(e.ids)) for e in encs])
    kw = {}
    if types:
        kw["token_type_ids"] = torch.tensor([e.type_ids + [0] * (n - len(e.ids)) for e in encs])
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, **kw).logits[:, 0]
    return torch.sigmoid(logits).double().numpy()


def make_modernbert(path: Path, head: str | None = None, **config):
    """A tiny random ModernBERT written by transformers (4 layers, global every 3rd, local ones
    seeing 4 positions either side, 64 positions, rotary bases 1000 and 10000) with the
    WordPiece tokenizer: `ModernBertModel`, or with `head` "ForSequenceClassification" that
    (`config`: its labels, classifier_pooling). Weights N(0, 0.3) (norms' N(1, 0.3)) so that
    the layers change the rows. Returns the model."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.ModernBertConfig(
        vocab_size=len(WORDS), hidden_size=32, intermediate_size=48, num_hidden_layers=4,
        num_attention_heads=2, max_position_embeddings=64, local_attention=8,
        global_attn_every_n_layers=3, pad_token_id=0, bos_token_id=2, eos_token_id=3,
        cls_token_id=2, sep_token_id=3, global_rope_theta=1000.0, **config,
    )  # fmt: skip
    model = getattr(transformers, f"ModernBert{head or 'Model'}")(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(1.0 if "norm" in name else 0.0, 0.3)
    model.save_pretrained(path)
    save_wordpiece_tokenizer(path)
    return model
