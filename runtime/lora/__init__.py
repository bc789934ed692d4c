"""Multi-LoRA serving (docs/runtime.md, "LoRA adapters"): `config` (the flags, `LoRARequest`),
`adapter` (reading and checking a PEFT directory), `layer` (the batched wrapper of a linear),
`slots` (adapters in host memory and in the device slots, the step's index), `engine` (what the
engine core asks: requests' adapters, prefix-cache salts, the scheduler's limit, metrics)."""
