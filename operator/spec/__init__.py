"""What the operator is asked to do: the InferenceService spec, parsed, defaulted and validated
once into frozen dataclasses, its status, and the operator's own settings.

* `fields.py`            — typed readers over a raw spec, `SpecError`
* `model_ref.py`         — `spec.model` → `ModelRef`, `spec.adapters` → `Adapter`s, `engine.lora`
* `engine.py`            — `spec.engine` (the `pagoda serve` flags) → `EngineSpec`; `spec.autotune`
* `scaling.py`           — `spec.parallelism`, `spec.autoscaling`
* `inference_service.py` — `InferenceServiceSpec`: the top level (resources, the model cache) and
                           the checks across sections
* `pod_fields.py`        — node selector, tolerations, env, engine.extraArgs and the Secret
                           references, checked as the API server and `pagoda serve` would take them
* `validation.py`        — a body → the spec; the checks only the cluster can answer (PVC, GPUs)
* `status.py`            — conditions and the minimal status patch (pure)
* `config.py`            — `OperatorConfig`, the operator's settings
"""
