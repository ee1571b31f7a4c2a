"""The one resolver of a pod's limits: resources are the ceiling, annotations only lower it.

The same function answers the pod source and the device plugin's Allocate
(tests/device_plugin/test_device_plugin.py checks Allocate's side)."""

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st
from vgpu_common.limits import UNCHANGED, WHOLE_GPU, GpuLimits, known
from vgpu_hypervisor.kubernetes import annotations as a
from vgpu_hypervisor.kubernetes import resolver as r
from vgpu_hypervisor.kubernetes.model import KubePod, UserGroup

from tests.kubernetes.test_annotations import UUID0, UUID1, pod

GiB = 1 << 30
GPUS = (
    a.NodeGpu(0, UUID0, "NVIDIA H100 80GB HBM3", 80 * GiB),
    a.NodeGpu(1, UUID1, "NVIDIA H100 80GB HBM3", 80 * GiB),
)
ADMIN = r.Ceiling(1 * GiB, "the limit set through the API")


def test_a_pod_asking_only_for_a_gpu_gets_that_whole_gpu_not_no_limit() -> None:
    found = r.resolve(pod({}, {"vgpu.io/gpu": "1"}), GPUS, assigned=(UUID1,))
    assert found.problems == found.refused == ()
    assert found.gpus == {UUID1: GpuLimits(memory=80 * GiB, compute=None)}
    assert found.limits() == {UUID1: GpuLimits(memory=80 * GiB, compute=None, burst=None)}
    assert found.from_resources


def test_a_pod_asking_only_for_a_gpu_gets_the_default_limits_where_set() -> None:
    """The defaults are ceilings like resources: an annotation lowers them, never raises them;
    a default above a GPU's memory is that GPU; a pod with annotations alone keeps the whole
    GPU (no scheduler counted it, and the pod source holds it to what it started with)."""
    names = a.ResourceNames(default_memory=8 * GiB, default_compute=2500)
    found = r.resolve(pod({}, {"vgpu.io/gpu": "1"}), GPUS, names, assigned=("0",))
    assert found.gpus == {UUID0: GpuLimits(memory=8 * GiB, compute=2500)}
    asking = pod({}, {"vgpu.io/gpu": "1", "vgpu.io/gpu-compute": "50"})
    found = r.resolve(asking, GPUS, names, assigned=("0",))
    assert found.gpus == {UUID0: GpuLimits(memory=8 * GiB, compute=5000)}
    greedy = pod({a.VRAM_LIMIT: "16Gi", a.COMPUTE_LIMIT: "10"}, {"vgpu.io/gpu": "1"})
    found = r.resolve(greedy, GPUS, names, assigned=("0",))
    assert found.gpus == {UUID0: GpuLimits(memory=8 * GiB, compute=1000)}
    (refused,) = found.refused
    assert (
        "vram-limit='16Gi': asks more than 8 GiB, the ceiling from the default memory 8 GiB "
        "(no vgpu.io/gpu-memory asked)"
    ) in refused
    huge = a.ResourceNames(default_memory=100 * GiB)
    found = r.resolve(pod({}, {"vgpu.io/gpu": "1"}), GPUS, huge, assigned=("0",))
    assert found.gpus == {UUID0: GpuLimits(memory=80 * GiB, compute=None)}
    alone = r.resolve(pod({a.GPU_IDS: "0"}, {}), GPUS, names)
    assert alone.gpus == {UUID0: GpuLimits(memory=80 * GiB, compute=None)}


def test_fractional_resources_are_exactly_the_limits() -> None:
    found = r.resolve(
        pod({}, {"vgpu.io/gpu": "1", "vgpu.io/gpu-memory": "4", "vgpu.io/gpu-compute": "25"}),
        GPUS,
        assigned=("0",),
    )
    assert found.gpus == {UUID0: GpuLimits(memory=4 * GiB, compute=2500)}


def test_an_annotation_above_a_whole_gpu_is_refused_too() -> None:
    found = r.resolve(pod({a.VRAM_LIMIT: "100Gi"}, {"vgpu.io/gpu": "1"}), GPUS, assigned=("0",))
    assert found.gpus[UUID0].memory == 80 * GiB
    (refused,) = found.refused
    assert "vram-limit='100Gi': asks more than 80 GiB, the ceiling from the whole GPU 0" in refused


def test_per_gpu_and_tflops_annotations_are_named_when_refused() -> None:
    found = r.resolve(
        pod({a.VRAM_LIMIT + ".1": "8Gi", a.TFLOPS_LIMIT: "494.5"},
            {"vgpu.io/gpu": "2", "vgpu.io/gpu-memory": "4", "vgpu.io/gpu-compute": "20"}),
        GPUS,
        assigned=(UUID0, UUID1),
    )  # fmt: skip
    assert found.gpus == {
        UUID0: GpuLimits(memory=4 * GiB, compute=2000),
        UUID1: GpuLimits(memory=4 * GiB, compute=2000),
    }
    assert found.problems == ()
    assert sorted(line.split(":")[1].strip() for line in found.refused) == [
        "tensor-fusion.ai/tflops-limit='494.5'",  # 50 % of an H100, on each GPU
        "tensor-fusion.ai/tflops-limit='494.5'",
        "tensor-fusion.ai/vram-limit.1='8Gi'",
    ]
    for line in found.refused:
        source = "gpu-compute=20" if "tflops" in line else "gpu-memory=4 (units of 1 GiB)"
        assert f"the ceiling from resource vgpu.io/{source};" in line


def test_given_ceilings_replace_the_resources_field_by_field() -> None:
    """An admin's change through the API: annotations may lower it, not raise it."""
    resources = {"vgpu.io/gpu": "1", "vgpu.io/gpu-memory": "4", "vgpu.io/gpu-compute": "50"}
    ceilings = {UUID0: r.GpuCeiling(memory=ADMIN)}
    raised = r.resolve(pod({a.VRAM_LIMIT: "2Gi", a.COMPUTE_LIMIT: "60"}, resources), GPUS,
                       assigned=("0",), ceilings=ceilings)  # fmt: skip
    assert raised.gpus == {UUID0: GpuLimits(memory=1 * GiB, compute=5000)}
    assert [line.split("'")[0] for line in raised.refused] == [
        "pod ml/train: tensor-fusion.ai/vram-limit=",
        "pod ml/train: tensor-fusion.ai/compute-limit=",
    ]
    assert "the ceiling from the limit set through the API;" in raised.refused[0]
    lowered = r.resolve(pod({a.VRAM_LIMIT: "512Mi"}, resources), GPUS, assigned=("0",),
                        ceilings=ceilings)  # fmt: skip
    assert lowered.gpus[UUID0].memory == 512 << 20 and lowered.refused == ()
    gone = r.resolve(pod({}, resources), GPUS, assigned=("0",), ceilings=ceilings)
    assert gone.gpus[UUID0] == GpuLimits(memory=1 * GiB, compute=5000)


def test_a_pod_with_ceilings_keeps_its_gpus_without_annotations() -> None:
    """An annotations-only pod whose annotations are all removed: not unlimited."""
    started = r.GpuCeiling(r.Ceiling(2 * GiB, "its start"), r.Ceiling(1000, "its start"))
    found = r.resolve(pod({}), GPUS[:1], ceilings={UUID0: started})
    assert found.wants_gpu and not found.from_resources
    assert found.gpus == {UUID0: GpuLimits(memory=2 * GiB, compute=1000)}
    assert r.resolve(pod({}), GPUS[:1]) == r.Resolution(wants_gpu=False)


def test_the_gpus_the_device_plugin_gave_win_over_gpu_ids() -> None:
    found = r.resolve(pod({a.GPU_IDS: "0", a.VRAM_LIMIT: "1Gi"}, {"vgpu.io/gpu": "1"}), GPUS,
                      assigned=(UUID1,))  # fmt: skip
    assert list(found.gpus) == [UUID1] and found.gpus[UUID1].memory == 1 * GiB
    (problem,) = found.problems
    assert problem == (
        "pod ml/train: tensor-fusion.ai/gpu-ids='0': the device plugin gave the pod GPU 1, "
        "where its limits apply"
    )


def test_a_burst_without_a_compute_limit_is_a_problem_not_a_failed_write() -> None:
    found = r.resolve(pod({a.COMPUTE_BURST: "80"}, {"vgpu.io/gpu": "1"}), GPUS, assigned=("0",))
    assert found.gpus[UUID0].burst is None
    (problem,) = found.problems
    assert "compute-burst='80': a burst needs a compute limit below 100 %" in problem
    kept = r.resolve(pod({a.COMPUTE_LIMIT: "30", a.COMPUTE_BURST: "80"}), GPUS[:1])
    assert kept.limits(keep_burst=frozenset({UUID0}))[UUID0].burst is UNCHANGED  # the admin's
    assert kept.limits()[UUID0].burst == 8000


def test_oversubscription_of_a_gpu_without_a_memory_limit_is_a_problem_there() -> None:
    """A GPU whose memory the node does not know has no limit to oversubscribe past: the
    pod is told, and its other GPUs oversubscribe."""
    unknown = (GPUS[0], dataclasses.replace(GPUS[1], memory_total=None))
    found = r.resolve(pod({a.VRAM_OVERSUBSCRIBE: "true"}), unknown)
    limits = found.limits()
    assert limits[UUID0].oversubscribe and not limits[UUID1].oversubscribe
    (problem,) = found.problems
    assert problem == (
        "pod ml/train: tensor-fusion.ai/vram-oversubscribe='true': GPU 1 has no memory limit "
        "to oversubscribe: ignored there"
    )


def test_zero_memory_units_are_a_problem_not_an_unlimited_pod() -> None:
    found = r.resolve(pod({}, {"vgpu.io/gpu": "1", "vgpu.io/gpu-memory": "0"}), GPUS,
                      assigned=("0",))  # fmt: skip
    assert found.gpus[UUID0].memory == 80 * GiB
    (problem,) = found.problems
    assert "resource vgpu.io/gpu-memory='0': expected at least 1 unit" in problem


@given(
    st.dictionaries(
        st.sampled_from([a.VRAM_LIMIT, a.COMPUTE_LIMIT, a.TFLOPS_LIMIT, a.VRAM_LIMIT + ".0"]),
        st.sampled_from(["1Gi", "3Gi", "100Gi", "5", "30", "100", "200", "bad"]),
    ),
    st.sampled_from([None, "1", "2", "4", "0"]),
    st.sampled_from([None, "10", "50", "100"]),
)
def test_no_annotation_ever_passes_the_ceiling(
    annotations: dict[str, str], memory: str | None, compute: str | None
) -> None:
    resources = {"vgpu.io/gpu": "1"}
    resources |= {"vgpu.io/gpu-memory": memory} if memory else {}
    resources |= {"vgpu.io/gpu-compute": compute} if compute else {}
    found = r.resolve(pod(annotations, resources), GPUS, assigned=("0",))
    limits = found.gpus[UUID0]
    memory_ceiling = int(memory) * GiB if memory and memory != "0" else 80 * GiB
    bytes_, hundredths = known(limits.memory), known(limits.compute)
    assert bytes_ is not None and bytes_ <= memory_ceiling
    if compute is not None and compute != "100":  # 100 %, the whole GPU, is no limit
        assert hundredths is not None and hundredths <= int(compute) * 100
    else:
        assert hundredths is None or hundredths < WHOLE_GPU


def _secured(
    pod_ids: UserGroup,
    fs_group: int | None,
    *containers: tuple[UserGroup, dict[str, str]],
) -> KubePod:
    made = pod({}, *(resources for _, resources in containers))
    with_ids = tuple(
        dataclasses.replace(container, run_as=ids)
        for container, (ids, _) in zip(made.containers, containers, strict=True)
    )
    return dataclasses.replace(made, containers=with_ids, run_as=pod_ids, fs_group=fs_group)


GPU = {"vgpu.io/gpu": "1"}


@pytest.mark.parametrize(
    ("pod_ids", "fs_group", "containers", "owner"),
    [
        # The pod's runAsUser and runAsGroup, fsGroup winning for the group.
        (UserGroup(1000, 3000), 2000, [(UserGroup(), GPU)], UserGroup(1000, 2000)),
        (UserGroup(1000, 3000), None, [(UserGroup(), GPU)], UserGroup(1000, 3000)),
        # A container's own over the pod's.
        (UserGroup(1000, 3000), None, [(UserGroup(1001, 3001), GPU)], UserGroup(1001, 3001)),
        # Two GPU containers as different users: no one user; the group they share.
        (
            UserGroup(None, 3000),
            None,
            [(UserGroup(1000), GPU), (UserGroup(1001), GPU)],
            UserGroup(None, 3000),
        ),
        # One runs as its image says (unknown): no user; fsGroup reaches both.
        (UserGroup(), 2000, [(UserGroup(1000), GPU), (UserGroup(), GPU)], UserGroup(None, 2000)),
        # Only the containers that use the region count.
        (UserGroup(), None, [(UserGroup(1000), GPU), (UserGroup(0), {"cpu": "1"})],
         UserGroup(1000, None)),
        # Root is no owner; nothing set is root's too.
        (UserGroup(0, 0), 0, [(UserGroup(), GPU)], UserGroup()),
        (UserGroup(), None, [(UserGroup(), GPU)], UserGroup()),
    ],
)  # fmt: skip
def test_the_region_belongs_to_the_user_and_group_the_pods_gpu_containers_run_as(
    pod_ids: UserGroup,
    fs_group: int | None,
    containers: list[tuple[UserGroup, dict[str, str]]],
    owner: UserGroup,
) -> None:
    secured = _secured(pod_ids, fs_group, *containers)
    assert r.region_owner(secured) == owner
    assert r.resolve(secured, GPUS, assigned=(UUID0,)).owner == owner


def test_a_pod_with_annotations_alone_counts_every_container() -> None:
    annotated = dataclasses.replace(
        _secured(UserGroup(), None, (UserGroup(1000), {}), (UserGroup(1000), {})),
        annotations={a.VRAM_LIMIT: "1Gi"},
    )
    assert r.resolve(annotated, GPUS).owner == UserGroup(1000, None)
