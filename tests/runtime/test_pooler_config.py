"""`--runner auto`'s rule and `--pooler-config`'s checks, on config files alone (no weights)."""

from __future__ import annotations

import json

import pytest
from pagoda.runtime.config import EngineConfig
from pagoda.runtime.pooler_config import PoolerConfig, check_not_encoder, resolve


def _dir(tmp_path, name):
    (tmp_path / name).mkdir()
    return tmp_path / name


def _checkpoint(path, archs=("Qwen3ForCausalLM",), modes=None, normalize=True, **extra):
    (path / "config.json").write_text(json.dumps({"architectures": list(archs), **extra}))
    if modes is not None:
        mods = [{"path": "", "type": "sentence_transformers.models.Transformer"},
                {"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]  # fmt: skip
        if normalize:
            mods.append({"path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (path / "modules.json").write_text(json.dumps(mods))
        (path / "1_Pooling").mkdir()
        (path / "1_Pooling" / "config.json").write_text(json.dumps(modes))
    return path


def test_auto_reads_the_sentence_transformers_layout_and_bare_decoders(tmp_path):
    a = _checkpoint(_dir(tmp_path, "a"),
                    modes={"pooling_mode_mean_tokens": True}, normalize=False)  # fmt: skip
    assert resolve("auto", None, a, 64) == ("pooling", PoolerConfig("MEAN", False))
    b = _checkpoint(_dir(tmp_path, "b"), ("LlamaModel",))
    assert resolve("auto", None, b, 64) == ("pooling", PoolerConfig("LAST", True))
    c = _checkpoint(_dir(tmp_path, "c"))
    assert resolve("auto", None, c, 64) == ("generate", None)
    # the user's keys over the checkpoint's; the checkpoint's Matryoshka widths
    d = _checkpoint(_dir(tmp_path, "d"),
                    modes={"pooling_mode_lasttoken": True}, matryoshka_dimensions=[32, 64])  # fmt: skip
    _, pc = resolve("auto", PoolerConfig.parse('{"dimensions": 32}'), d, 64)
    assert pc == PoolerConfig("LAST", True, 32, True, (32, 64))
    assert pc.check_dimensions(48, 64) is not None and pc.check_dimensions(64, 64) is None


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ('{"pooling_type": "MAX"}', "pooling_type must be one of"),
        ('{"normalize": 1}', "normalize must be true or false"),
        ('{"dimensions": 0}', "dimensions must be a positive integer"),
        ('{"softmax": true}', "unknown or unsupported key"),
        ("[1]", "must be a JSON object"),
        ("{", "not JSON"),
    ],
)
def test_bad_pooler_config_is_one_line(value, words):
    with pytest.raises(ValueError, match=words) as e:
        EngineConfig.create("m", runner="pooling", pooler_config=value)
    assert "\n" not in str(e.value)


def test_refusals(tmp_path):
    with pytest.raises(ValueError, match="encoder-only model"):
        check_not_encoder(["ModernBertForMaskedLM"])
    with pytest.raises(ValueError, match="runner must be one of"):
        EngineConfig.create("m", runner="draft")
    _checkpoint(tmp_path, ("Qwen3Model",))
    with pytest.raises(ValueError, match="bare decoder without an LM head"):
        resolve("generate", None, tmp_path, 64)
    (tmp_path / "modules.json").write_text(
        json.dumps([{"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}])
    )
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text('{"pooling_mode_max_tokens": true}')
    with pytest.raises(ValueError, match="pooling_mode_max_tokens is not supported"):
        resolve("auto", None, tmp_path, 64)


def test_a_cross_encoder_is_refused_in_one_line(tmp_path):
    """A `*ForSequenceClassification` checkpoint not served (Phi-3's: the served ones are BERT's,
    RoBERTa's, ModernBERT's and Qwen2/3's, Llama's, Mistral's, Gemma's) has no
    runner: its config.json alone is refused, the line `pagoda serve` prints before exiting 2."""
    from pagoda.runtime.model.hf_loader import read_config

    _checkpoint(tmp_path, ("Phi3ForSequenceClassification",), model_type="phi3")
    with pytest.raises(ValueError, match="Phi3ForSequenceClassification is a sequence-") as e:
        read_config(tmp_path)
    assert "\n" not in str(e.value) and "cross-encoder" in str(e.value)


def test_a_user_config_naming_every_key_still_has_its_dimensions_checked(tmp_path):
    """A user's config giving pooling_type, normalize and dimensions is not taken as resolved:
    the checkpoint's Matryoshka fields are read and `dimensions` checked against them. What
    `resolve` answers is final: resolving it again reads no file (EngineCore's second call
    after `pagoda serve`'s)."""
    _checkpoint(tmp_path, ("Qwen3Model",))
    every_key = {"pooling_type": "LAST", "normalize": True, "dimensions": 9999}
    with pytest.raises(ValueError, match="Matryoshka"):
        resolve("pooling", PoolerConfig.parse(every_key), tmp_path, 64)
    _checkpoint(tmp_path, ("Qwen3Model",), matryoshka_dimensions=[16, 64])
    user = PoolerConfig.parse({**every_key, "dimensions": 16})
    _, pc = resolve("pooling", user, tmp_path, 64)
    assert pc.checked and not user.checked and pc.matryoshka_dimensions == (16, 64)
    (tmp_path / "config.json").unlink()
    assert resolve("pooling", pc, tmp_path, 64) == ("pooling", pc)


def test_a_user_config_equal_to_the_checkpoints_still_turns_prefix_caching_off(tmp_path):
    """`--runner pooling --pooler-config` naming what the checkpoint would choose anyway (CLS,
    normalized, for an encoder) is resolved like any other: prefix caching off (a cached
    prefix would leave its rows out of the vector), the resolved config marked `checked`, and
    a second `with_runner` returns the config unchanged."""
    from pagoda.runtime.pooler_config import with_runner

    _checkpoint(tmp_path, ("BertModel",))
    user = PoolerConfig.parse({"pooling_type": "CLS", "normalize": True})
    cfg = EngineConfig(model=str(tmp_path), runner="pooling", pooler_config=user)
    assert cfg.cache.enable_prefix_caching
    out = with_runner(cfg, tmp_path, 64)
    assert not out.cache.enable_prefix_caching and out.pooler_config.checked
    assert not out.scheduler.enable_chunked_prefill
    assert with_runner(out, tmp_path, 64) is out


def test_with_runner_reads_the_checkpoints_config_json_once(tmp_path, monkeypatch):
    """`--runner auto` on an encoder: the runner, its pooler and the chunked-prefill rule all
    come from one read of config.json (`resolve` is handed what `with_runner` read)."""
    from pagoda.runtime import pooler_config

    _checkpoint(tmp_path, ("BertModel",))
    reads = []
    read_json = pooler_config._read_json

    def counted(path):
        reads.append(path)
        return read_json(path)

    monkeypatch.setattr(pooler_config, "_read_json", counted)
    out = pooler_config.with_runner(EngineConfig(model=str(tmp_path), runner="auto"), tmp_path, 64)
    assert out.runner == "pooling" and not out.scheduler.enable_chunked_prefill
    assert reads.count(tmp_path / "config.json") == 1
