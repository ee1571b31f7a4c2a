"""Registration and ListAndWatch streams: a kubelet keeps a stream open for every Register it
takes, so a plugin that registers again carelessly, or a client that opens streams and keeps
them, must not take the threads Allocate needs (the kubelet's Allocate waits without end)."""

import dataclasses

import pytest
from vgpu_hypervisor.device_plugin.proto import api_pb2
from vgpu_hypervisor.device_plugin.server import DevicePlugin
from vgpu_hypervisor.device_plugin.serving import STREAMS
from vgpu_hypervisor.gpu import NOT_AVAILABLE, NodeSnapshot

from tests.device_plugin.conftest import Node, serving
from tests.device_plugin.kubelet import Watch
from tests.device_plugin.test_device_plugin import RESOURCES, allocate, registered
from tests.hypervisor.conftest import wait_for


def test_a_register_that_fails_is_tried_again_alone_and_leaks_no_stream(
    node: Node, snapshot: NodeSnapshot
) -> None:
    """The kubelet reads a stream for each Register it takes, and the compute resource's
    Register fails four times after the kubelet opened its stream (the answer lost). Only that
    resource is registered again, each time through a new server (which ends the stream the
    failed Register left): each resource ends with one stream, and Allocate answers. (All three
    were registered again after any failure, through the same servers: a stream leaked per try
    and resource, and after four the servers had no thread left for Allocate or Register.)"""
    kubelet = node.kubelet
    kubelet.follow = True
    kubelet.refuse["vgpu.io/gpu-compute"] = 4
    with serving(node, snapshot) as plugin:
        wait_for(plugin.registered, timeout=30)
        assert kubelet.asked.count("vgpu.io/gpu") == kubelet.asked.count("vgpu.io/gpu-memory") == 1
        assert kubelet.asked.count("vgpu.io/gpu-compute") == 5
        wait_for(lambda: all(kubelet.open_streams(r) == 1 for r in RESOURCES), timeout=30)
        request = registered(node)["vgpu.io/gpu"]
        answer = allocate(node, request, [plugin.ids["gpu"][0]])
        assert dict(answer.envs)["NVIDIA_VISIBLE_DEVICES"] == str(snapshot.devices[0].uuid)


def test_streams_past_the_most_end_the_oldest_and_allocate_still_answers(
    node: Node, plugin: DevicePlugin, snapshot: NodeSnapshot
) -> None:
    """Two streams more than a server keeps on one resource: the two oldest end, the others
    still follow the GPUs' health, and GetDevicePluginOptions and Allocate answer. (With four
    threads for everything, the fifth stream and every call after it waited for ever.)"""
    request = registered(node)["vgpu.io/gpu"]
    watches = [Watch(node.kubelet.plugin(request)) for _ in range(STREAMS + 2)]
    try:
        for watch in watches:  # each one's first list: it has its thread
            assert len(watch.next().devices) == len(plugin.ids["gpu"])
        stub = node.kubelet.plugin(request)
        assert not stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=10).pre_start_required
        assert allocate(node, request, [plugin.ids["gpu"][0]]).envs
        for ended in watches[:2]:
            with pytest.raises(StopIteration):
                ended.next()
        lost = dataclasses.replace(snapshot.devices[1], uuid=NOT_AVAILABLE)
        plugin.update_health(dataclasses.replace(snapshot, devices=(snapshot.devices[0], lost)))
        for kept in watches[2:]:
            assert "Unhealthy" in {d.health for d in kept.next().devices}
    finally:
        for watch in watches:
            watch.cancel()
