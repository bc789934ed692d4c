"""Helium (`HeliumForCausalLM`: Helium-1 2B): Llama's model with

- the rotary in the interleaved layout, pairs (2i, 2i + 1) (GLM's: `ops.rotary_interleaved`,
  `FamilyConfig.rope_interleaved`);
- RMSNorm scaling in float32 before rounding once (OLMo 2's: `ops.gemma_rms_norm` with the
  weight as stored; in float32 the same as `ops.rms_norm`), eps 1e-8 by default;
- biases on q, k and v where `attention_bias` says, none on o.
"""

from __future__ import annotations

from pagoda.runtime.model.llama import LlamaModel
from pagoda.runtime.model.ops import gemma_rms_norm


class HeliumModel(LlamaModel):
    rms_norm_16bit = staticmethod(gemma_rms_norm)
