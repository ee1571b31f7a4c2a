"""Generated kubelet device-plugin v1beta1 messages and services (see api.proto)."""
