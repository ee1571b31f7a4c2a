"""The DRA driver (`gpu.vgpu.io`): the kubelet's plugin registration and DRA node service over
gRPC, claims turned into pods' regions and CDI specs, and the node's ResourceSlice.

Nothing is imported here: gRPC, the generated stubs and the API client load only when the
driver runs (--dra).
"""
