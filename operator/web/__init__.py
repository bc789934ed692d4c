"""The operator's HTTP port: `server.py` (`/healthz`, `/readyz`, routes of other modules) and
`metrics.py` (`GET /metrics`). `POST /alerts` is the autoscaler's (autoscaling/alerts.py)."""
