"""Which heads, rows and vocabulary each rank holds, and the sizes that cannot be split."""

from __future__ import annotations

import pytest
from pagoda.runtime.config import FamilyConfig, ModelConfig
from pagoda.runtime.distributed.layout import TPLayout, check
from pagoda.runtime.model_configs import ExpertRouting, MiMoAttention
from pagoda.runtime.recurrent_configs import MambaConfig, NemotronHExperts


def nemotron_experts(width=32, shared=32) -> MambaConfig:
    moe = NemotronHExperts(
        layers=(False, True),
        num_experts=4,
        top_k=2,
        intermediate=width,
        shared_intermediate=shared,
        routing=ExpertRouting(),
    )
    return MambaConfig(layers=(True, False), n_heads=8, head_dim=8, d_state=16, moe=moe)


def model(heads=8, kv=2, inter=64, arch="llama", **family) -> ModelConfig:
    return ModelConfig(vocab_size=301, hidden_size=64, intermediate_size=inter, num_layers=2,
                       num_heads=heads, num_kv_heads=kv, head_dim=8, architecture=arch,
                       family=FamilyConfig(**family))  # fmt: skip


def test_heads_split_and_kv_heads_split_or_replicated():
    lays = [TPLayout(r, 4) for r in range(4)]
    assert [x.heads(8) for x in lays] == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert [x.kv_heads(8) for x in lays] == [(0, 2), (2, 4), (4, 6), (6, 8)]
    # 2 KV heads over 4 ranks: each is held by the two ranks whose query heads read it
    assert [x.kv_heads(2) for x in lays] == [(0, 1), (0, 1), (1, 2), (1, 2)]
    for x in lays:  # query head h reads KV head h // (8 // 2): the rank's own KV head
        (q0, q1), (k0, _) = x.heads(8), x.kv_heads(2)
        assert {h // 4 for h in range(q0, q1)} == {k0}


def test_qkv_rows_are_the_ranks_query_and_kv_heads_rows():
    """The rows of a stacked q/k/v layer (and of a LoRA adapter of it) one rank holds."""
    assert TPLayout(1, 4).qkv_rows(8, 8, 16) == [(32, 64), (32, 64), (32, 64)]
    assert TPLayout(3, 4).qkv_rows(8, 2, 16) == [(96, 128), (16, 32), (16, 32)]  # replicated


def test_local_head_counts():
    assert TPLayout(1, 4).local_heads(8, 8) == (2, 2)
    assert TPLayout(3, 4).local_heads(8, 2) == (2, 1)  # a replicated KV head


def test_the_vocabulary_is_padded_to_a_multiple_of_the_ranks():
    assert [TPLayout(r, 2).vocab(301) for r in range(2)] == [(0, 151), (151, 302)]


@pytest.mark.parametrize(
    ("config", "size", "words"),
    [
        (model(heads=6, kv=6), 4, "does not divide the model's 6 attention heads"),
        (model(heads=12, kv=3), 4, "3 KV heads can neither be split over 4 ranks"),
        (model(inter=66), 4, "does not divide the model's MLP width (66)"),
        (model(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=30), 4,
         "experts' width (moe_intermediate_size 30)"),
        (model(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
               shared_expert_intermediate_size=42), 4,
         "shared expert's width (shared_expert_intermediate_size 42)"),
        (model(heads=6, kv=1, inter=66, arch="mimo_v2_flash",
               mimo=MiMoAttention(swa_kv_heads=2, v_head_dim=8)), 3,
         "the sliding layers' 2 KV heads can neither be split over 3 ranks"),  # MiMo-V2-Flash's
        (model(arch="nemotron_h", mamba=nemotron_experts(width=30)), 4,
         "experts' width (moe_intermediate_size 30)"),  # Nemotron-H's MoE blocks
        (model(arch="nemotron_h", mamba=nemotron_experts(shared=42)), 4,
         "experts' width (moe_shared_expert_intermediate_size 42)"),
        # DiffLlama's pairs: a share of each half of the query and KV heads on every rank
        (model(kv=2, arch="diffllama", diff_attention=True), 2,
         "does not divide half of DiffLlama's heads (num_key_value_heads 2: differential"),
        (model(heads=4, kv=4, arch="diffllama", diff_attention=True), 4,
         "half of DiffLlama's heads (num_attention_heads 4: differential attention pairs head "
         "i with head i"),
        # JetMoE's KV heads carry their experts' query heads: split, never replicated
        (model(heads=2, kv=1, arch="jetmoe"), 2,
         "does not divide JetMoE's KV heads (num_key_value_heads 1: each is split with"),
        # RWKV's time-mix by channels, xLSTM's mLSTM by heads (no attention: the stand-in
        # heads not checked, the channel-mix's or FFN's width is)
        (model(heads=5, kv=5, arch="rwkv", mamba=MambaConfig(
            layers=(True, True), n_heads=1, head_dim=66, d_state=3, d_conv=2, mixer="wkv")), 4,
         "does not divide the wkv channels (attention_hidden_size 66)"),
        (model(heads=5, kv=5, inter=66, arch="rwkv", mamba=MambaConfig(
            layers=(True, True), n_heads=1, head_dim=64, d_state=3, d_conv=2, mixer="wkv")), 4,
         "does not divide the model's MLP width (66)"),
        (model(heads=5, kv=5, arch="xlstm", mamba=MambaConfig(
            layers=(True, True), n_heads=6, head_dim=8, d_state=4, mixer="mlstm")), 4,
         "does not divide the mLSTM heads (num_heads 6)"),
    ],
)  # fmt: skip
def test_what_does_not_divide_is_named(config, size, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        check(config, size)
    check(config, 1)


def test_each_family_entry_names_a_registered_architecture_and_its_function():
    """`tp_families`' tables name modules by string (imported when asked): each key is a
    registered architecture and each module has the function, so a typo cannot leave a
    family's shapes unchecked."""
    import importlib

    from pagoda.runtime.distributed import tp_families
    from pagoda.runtime.model.gemma4_config import GEMMA4_LAYERS
    from pagoda.runtime.model.registry import MODEL_CLASSES

    assert tp_families._GEMMA4 == GEMMA4_LAYERS

    for table, name in ((tp_families.TP_PROBLEMS, "tp_problem"),
                        (tp_families.RANK_ROWS, "rank_rows")):  # fmt: skip
        for arch, module in table.items():
            assert arch in MODEL_CLASSES, arch
            fn = getattr(importlib.import_module(f"pagoda.runtime.model.{module}"), name, None)
            assert callable(fn), (arch, module, name)
    for arch in {*tp_families.TP_PROBLEMS, *tp_families.RANK_ROWS}:  # without its sub-config
        bare = model(arch=arch)  # (as test_family_options.py builds every architecture)
        assert tp_families.tp_problem(bare, 2) is None, arch
        tp_families.rank_rows(0, "self_attn.k_proj.weight", 16, 64, bare, TPLayout(0, 2))


def test_a_rank_outside_the_group_is_refused():
    with pytest.raises(ValueError, match="outside a group of 2"):
        TPLayout(2, 2)


def test_the_built_in_models_shapes_are_their_files():
    """`options.BUILTIN_MODELS` states each built-in model's shape for the operator, which has no
    model file (it refuses a tensor-parallel size the model cannot be split over): the numbers
    are the file's own, and the operator's arithmetic is the runtime's."""
    from pagoda.runtime import options
    from pagoda.runtime.model.gguf_loader import read_config
    from pagoda.runtime.model.gguf_reader import open_reader
    from pagoda.runtime.model.loader import builtin_model_path

    for name, builtin in options.BUILTIN_MODELS.items():
        config = read_config(open_reader(builtin_model_path(name)))
        shape = (config.num_heads, config.num_kv_heads, config.intermediate_size)
        assert shape == (builtin.num_heads, builtin.num_kv_heads, builtin.intermediate_size)
        for size in range(1, 17):
            try:
                check(config, size)
                problem = None
            except ValueError as e:
                problem = str(e)
            assert builtin.tensor_parallel_problem(size) == problem, size
