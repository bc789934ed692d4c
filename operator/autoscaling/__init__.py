"""Autoscaling: the pure policy, the loop that runs it, its inputs and the alert webhook.

* `policy.py`     — metrics → desired replicas (pure: `decide`, `alert_step`)
* `demand.py`     — the demand floor: arrival rate × a request's cost from the tuned profile
* `loop.py`       — the autoscaler: Prometheus → `decide` → Deployment replicas, status, Events
* `memory.py`     — what the autoscaler remembers, saved in `status.autoscaling.state` (failover)
* `prometheus.py` — Prometheus HTTP API client and the PromQL of each input
* `alerts.py`     — `POST /alerts`: Alertmanager payloads → one step per InferenceService
* `rules.py`      — the per-service PrometheusRule (pure; the builders use it)

Nothing is imported here, so `pagoda.operator.autoscaling.rules` stays free of aiohttp.
"""
