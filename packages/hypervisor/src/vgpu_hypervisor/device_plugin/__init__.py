"""The kubelet device plugin (API v1beta1): resources, Allocate's answer, the gRPC servers."""

from vgpu_hypervisor.device_plugin.allocation import AllocationError, Layout
from vgpu_hypervisor.device_plugin.resources import Gpu, ResourceNames
from vgpu_hypervisor.device_plugin.server import DevicePlugin, PluginConfig, inventory

__all__ = [
    "AllocationError",
    "DevicePlugin",
    "Gpu",
    "Layout",
    "PluginConfig",
    "ResourceNames",
    "inventory",
]
