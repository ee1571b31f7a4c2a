"""The binder's PodResources client across a kubelet restart."""

import time

import pytest
from vgpu_hypervisor.device_plugin.pod_resources import PodResources, PodResourcesError

from tests.device_plugin.conftest import Node
from tests.hypervisor.conftest import wait_for

# Long enough for gRPC's default backoff (1 s, 1.6 times more each try, 20 % either way) to
# leave the channel waiting at the restart: its third try comes by 6.2 s, its fourth after
# 7.4 s at the earliest.
DOWN_S = 6.5


def test_the_first_list_after_a_kubelet_restart_answers(node: Node) -> None:
    """The kubelet is down a while, the binder asking all along, then back: the binder's next
    List answers. (On the one channel it kept, it failed until gRPC's backoff, grown up to two
    minutes, let it try again: containers waiting for their region gave up after 60 s.)"""
    kubelet = node.kubelet
    client = PodResources(kubelet.pod_resources, "vgpu.io/gpu")
    try:
        assert client.holders() == []
        kubelet.stop()
        wait_for(lambda: not kubelet.pod_resources.exists())  # gRPC removes it, in its time
        down = time.monotonic()
        while time.monotonic() - down < DOWN_S:
            with pytest.raises(PodResourcesError, match="UNAVAILABLE"):
                client.holders()
            time.sleep(0.2)  # the binder's pace while an allocation waits
        kubelet.start()
        assert client.holders() == []
    finally:
        client.close()
