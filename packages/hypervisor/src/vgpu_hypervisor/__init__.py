"""tf-hypervisor: the vgpu node daemon and its command-line client."""
