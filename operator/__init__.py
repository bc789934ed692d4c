"""Pagoda's Kubernetes operator: the InferenceService CRD reconciled by kopf (see docs/operator.md)."""
