"""Generated kubelet PodResources v1 messages and services (see api.proto)."""
