"""The kubelet device plugin (API v1beta1): resources (`resources`), Allocate's answer
(`allocation`, `prepare`), the gRPC servers (`server`) and their start (`runner`).

Nothing is imported here: the daemon's settings read `resources` on every start, and gRPC and
the generated stubs load only when the plugin runs.
"""
