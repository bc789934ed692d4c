"""Multi-LoRA serving (docs/runtime.md, "LoRA adapters"), beside `pagoda.runtime.lora_config`
(the flags, `LoRARequest`, the families): `adapter` (reading and checking a PEFT directory),
`layer` (the batched wrapper of a linear), `slots` (adapters in host memory and in the device
slots, the step's index), `engine` (what the engine core and scheduler ask: prefix-cache salts,
the `--max-loras` gate, the adapters for metrics)."""
