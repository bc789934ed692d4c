"""What the operator is asked to do: the InferenceService spec, parsed, defaulted and validated
once into frozen dataclasses, its status, and the operator's own settings.

* `fields.py`            — typed readers over a raw spec, `SpecError`
* `model_ref.py`         — `spec.model` → `ModelRef`
* `autotune.py`          — `spec.autotune`
* `inference_service.py` — the spec dataclasses (`InferenceServiceSpec`, engine, resources, autoscaling)
* `pod_fields.py`        — node selector, tolerations, env and engine.extraArgs, checked as the API
                           server and `pagoda serve` would take them
* `validation.py`        — a body → the spec; the checks only the cluster can answer (PVC, GPUs)
* `status.py`            — conditions and the minimal status patch (pure)
* `config.py`            — `OperatorConfig`, the operator's settings
"""
