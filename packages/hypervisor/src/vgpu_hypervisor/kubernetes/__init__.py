"""Kubernetes integration: the pods of this node from the API server, their limits, events."""
