"""Generated kubelet messages and services of the DRA driver: plugin registration v1
(registration.proto) and the DRA node service v1 and v1beta1 (dra_v1.proto, dra_v1beta1.proto)."""
