"""The node daemon (`tf-hypervisor daemon`): its life (service), the node's pods (region files),
workers and picture (node), metrics, boost correction, and the HTTP API (api/)."""
