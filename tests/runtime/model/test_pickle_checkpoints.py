"""Checkpoints that ship PyTorch pickles only, as transformers saved them before safetensors
(`model/pickle_weights.py`): a sharded `pytorch_model-0000x-of-0000y.bin` set with its index and
an old single `pytorch_model.bin` (torch's legacy format, a base model's names, the LM head tied)
give transformers' own greedy tokens from the same files; safetensors are read where both are
there; a pickle that would run code is refused in one line and never run; FP8 on a
tensor-parallel rank builds from pickles as from safetensors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hf_oracle import hf_greedy_plain, make_tiny_model
from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.model.loader import load_model, read_model_config
from pagoda.runtime.model.safetensors_weights import SafetensorsWeights, checkpoint_files

transformers = pytest.importorskip("transformers")
PROMPT = [(7 * i + 3) % 290 + 5 for i in range(30)]
GREEDY = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, dict[str, torch.Tensor]]:
    """A tiny Qwen3 with a tied LM head, as transformers saves it (its safetensors), and its
    state dict as transformers 4 pickled it (the head and the embedding one storage)."""
    path = tmp_path_factory.mktemp("safetensors")
    model = make_tiny_model(path, "Qwen3", scale=6.0, head_dim=64, tie_word_embeddings=True)
    return path, model.state_dict()


def _bin_dir(tiny, folder: Path) -> Path:
    """`tiny`'s config and tokenizer in `folder`, without weights."""
    folder.mkdir()
    for f in tiny[0].iterdir():
        if f.name != "model.safetensors":
            (folder / f.name).write_bytes(f.read_bytes())
    return folder


def _same_tokens_as_transformers(path: Path) -> None:
    ref = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    want = hf_greedy_plain(ref, PROMPT, 5)[0]
    assert len(set(want)) > 1, want  # not a flat pick: the weights matter
    llm = LLM(loaded=load_model(str(path)), dtype="float32", kv_cache_memory=8 << 20)
    got = llm.generate({"prompt_token_ids": PROMPT}, GREEDY)[0].outputs[0].token_ids
    assert got == want


def test_sharded_pickles_match_transformers(tiny, tmp_path):
    path = _bin_dir(tiny, tmp_path / "sharded")
    state = tiny[1]
    assert state["lm_head.weight"].data_ptr() == state["model.embed_tokens.weight"].data_ptr()
    names = list(state)
    shards = [names[i : i + 9] for i in range(0, len(names), 9)]
    weight_map = {}
    for i, part in enumerate(shards, 1):
        shard = f"pytorch_model-{i:05d}-of-{len(shards):05d}.bin"
        torch.save({n: state[n] for n in part}, path / shard)
        weight_map |= dict.fromkeys(part, shard)
    (path / "pytorch_model.bin.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
    assert [f.name for f in checkpoint_files(path)] == sorted(set(weight_map.values()))
    _same_tokens_as_transformers(path)


def test_an_old_single_pickle_of_a_base_model_matches_transformers(tiny, tmp_path):
    """torch's legacy (non-zip) format, which cannot be memory-mapped; LlamaModel-style names
    without `model.` and no LM head (tied), which transformers loads under its prefix."""
    path = _bin_dir(tiny, tmp_path / "single")
    base = {n.removeprefix("model."): t for n, t in tiny[1].items() if n != "lm_head.weight"}
    torch.save(base, path / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    _same_tokens_as_transformers(path)


def test_safetensors_are_read_where_both_are_there(tiny, tmp_path):
    path = _bin_dir(tiny, tmp_path / "both")
    (path / "model.safetensors").write_bytes((tiny[0] / "model.safetensors").read_bytes())
    (path / "pytorch_model.bin").write_bytes(b"not read")
    assert checkpoint_files(path) == [path / "model.safetensors"]


class _RunsCode:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.marker}",)


def test_a_pickle_that_would_run_code_is_refused_in_one_line(tiny, tmp_path):
    """At start-up (`read_model_config`: `pagoda serve` then exits 2 with the line, before it
    binds) and at load: torch's weights-only unpickler refuses the global, nothing runs."""
    path = _bin_dir(tiny, tmp_path / "evil")
    marker = tmp_path / "ran"
    state = {n: t.clone() for n, t in tiny[1].items()}
    torch.save({**state, "extra": _RunsCode(marker)}, path / "pytorch_model.bin")
    for read in (read_model_config, load_model):
        with pytest.raises(ValueError) as err:
            read(str(path))
        said = str(err.value)
        assert "\n" not in said and "pytorch_model.bin: refused" in said, said
        assert "posix.system" in said, said
    assert not marker.exists()


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"version https://git-lfs.github.com/spec/v1\noid sha256:0\nsize 9\n", "Git LFS pointer"),
        (b"PK\3\4" + b"\0" * 60, "cannot read it as PyTorch weights: RuntimeError: "),
        (b"\x80\x02v" + b"\0" * 20, "damaged or not a pickle: Unsupported operand 118"),
        (None, "holds a list, not a state dict"),
    ],
    ids=["lfs-pointer", "truncated-zip", "foreign-bytes", "a-list"],
)
def test_a_damaged_pickle_is_one_line_naming_it(tmp_path, content, needle):
    path = tmp_path / "pytorch_model.bin"
    if content is None:
        torch.save([torch.zeros(2)], path)
    else:
        path.write_bytes(content)
    with pytest.raises(ValueError) as err:
        SafetensorsWeights.open(tmp_path)
    said = str(err.value)
    assert said.startswith("pytorch_model.bin") and needle in said and "\n" not in said, said


def _held(model) -> list[torch.Tensor]:
    """Every tensor a built model holds, in the order its attributes list them."""
    out, stack, seen = [], [model], set()
    while stack:
        o = stack.pop()
        if id(o) in seen or isinstance(o, (int, float, str, bool, type(None))):
            continue
        seen.add(id(o))
        if isinstance(o, torch.Tensor):
            out.append(o.to_dense() if o.is_mkldnn else o)
        elif isinstance(o, (list, tuple)):
            stack.extend(reversed(o))
        elif isinstance(o, dict):
            stack.extend(reversed(list(o.values())))
        else:
            names = list(getattr(o, "__dict__", {}))
            names += [n for c in type(o).__mro__ for n in getattr(c, "__slots__", ())]
            names = [n for n in names if n not in ("config", "ctx") and hasattr(o, n)]
            stack.extend(getattr(o, n) for n in reversed(names))
    return out


def test_fp8_on_a_tensor_parallel_rank_builds_the_same_from_pickles(tiny, tmp_path):
    """`--quantization fp8` and a rank of two (`model_bytes.build`: rank 0 built alone) read
    the pickles through the same seam: the same FP8 codes and scales, the same shards."""
    from model_bytes import build
    from pagoda.runtime.distributed.group import TPGroup
    from pagoda.runtime.distributed.layout import TPLayout
    from pagoda.runtime.quantization.fp8 import ONLINE_SCHEME

    path = _bin_dir(tiny, tmp_path / "fp8")
    torch.save(tiny[1], path / "pytorch_model.bin")
    rank0 = TPGroup(TPLayout(0, 2), torch.device("cpu"), None, None)
    built = [build(p, torch.bfloat16, tp=rank0, fp8=ONLINE_SCHEME) for p in (path, tiny[0])]
    assert any(t.dtype == torch.float8_e4m3fn for t in _held(built[0]))
    pickled, safetensors = (_held(m) for m in built)
    assert len(pickled) == len(safetensors)
    for a, b in zip(pickled, safetensors, strict=True):
        assert a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))
