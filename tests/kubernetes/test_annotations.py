"""A pod's annotations and resources resolved into limits per GPU."""

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st
from vgpu_common.limits import WHOLE_GPU, GpuLimits, Qos, known, parse_quantity, parse_switch
from vgpu_hypervisor.kubernetes import annotations as a
from vgpu_hypervisor.kubernetes import resolver as r
from vgpu_hypervisor.kubernetes.model import KubeContainer, KubePod

UUID0 = "GPU-00000000-1111-2222-3333-444444444444"
UUID1 = "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
GPUS = (a.NodeGpu(0, UUID0, "NVIDIA H100 80GB HBM3"), a.NodeGpu(1, UUID1, "Mystery GPU"))
GiB = 1 << 30


def pod(annotations: dict[str, str] | None = None, *resources: dict[str, str]) -> KubePod:
    containers = tuple(KubeContainer(f"c{i}", r) for i, r in enumerate(resources))
    return KubePod(
        "ml", "train", "uid-1", "node-a", "Pending", "1", "2026-01-01T00:00:00Z",
        annotations or {}, containers,
    )  # fmt: skip


def test_a_pod_without_annotations_or_resources_wants_no_gpu() -> None:
    plain = pod({"team": "x"}, {"cpu": "1"})
    assert r.resolve(plain, GPUS) == r.Resolution(wants_gpu=False)


def test_pod_wide_annotations_apply_to_every_gpu_named() -> None:
    found = r.resolve(
        pod({a.VRAM_LIMIT: "4Gi", a.COMPUTE_LIMIT: "30", a.GPU_IDS: "0", a.QOS: "High"}), GPUS
    )
    assert found.problems == ()
    assert found.gpus == {UUID0: GpuLimits(memory=4 * GiB, compute=3000)}
    assert found.qos is Qos.HIGH


def test_per_gpu_forms_override_the_pod_wide_value() -> None:
    found = r.resolve(
        pod(
            {a.VRAM_LIMIT: "4GiB", a.VRAM_LIMIT + ".1": "8GiB", a.COMPUTE_LIMIT + "." + UUID0: "50"}
        ),
        GPUS,
    )
    assert found.problems == ()
    assert found.gpus == {
        UUID0: GpuLimits(memory=4 * GiB, compute=5000),
        UUID1: GpuLimits(memory=8 * GiB),
    }


def test_resources_sum_over_containers() -> None:
    found = r.resolve(
        pod({}, {"vgpu.io/gpu": "1", "vgpu.io/gpu-memory": "2", "vgpu.io/gpu-compute": "20"},
            {"vgpu.io/gpu-memory": "1", "vgpu.io/gpu-compute": "10"}),
        GPUS, assigned=("1",),
    )  # fmt: skip
    assert found.problems == ()
    assert found.gpus == {UUID1: GpuLimits(memory=3 * GiB, compute=3000)}


def test_resource_names_are_settable() -> None:
    names = a.ResourceNames(
        "example.com/gpu", "example.com/mem", "example.com/cores", memory_unit=1 << 20
    )
    found = r.resolve(pod({}, {"example.com/mem": "512"}), GPUS[:1], names)
    assert found.gpus == {UUID0: GpuLimits(memory=512 << 20)}


def test_annotations_may_lower_resources_and_one_asking_more_is_refused() -> None:
    found = r.resolve(
        pod({a.VRAM_LIMIT: "4Gi", a.COMPUTE_LIMIT: "10", a.GPU_IDS: "0"},
            {"vgpu.io/gpu": "1", "vgpu.io/gpu-memory": "2", "vgpu.io/gpu-compute": "40"}),
        GPUS,
    )  # fmt: skip
    assert found.gpus == {UUID0: GpuLimits(memory=2 * GiB, compute=1000)}
    assert found.problems == ()
    assert found.refused == (
        "pod ml/train: tensor-fusion.ai/vram-limit='4Gi': asks more than 2 GiB, the ceiling from "
        "resource vgpu.io/gpu-memory=2 (units of 1 GiB); annotations only lower limits, so 2 GiB "
        "applies",
    )


def test_tflops_convert_through_the_table_and_an_unknown_gpu_is_a_problem() -> None:
    found = r.resolve(pod({a.TFLOPS_LIMIT: "247.25"}), GPUS)
    assert found.gpus[UUID0] == GpuLimits(compute=2500)
    assert found.gpus[UUID1] == GpuLimits()
    (problem,) = found.problems
    assert "tflops-limit" in problem and "Mystery GPU" in problem and "peak TFLOPS" in problem


@pytest.mark.parametrize(
    ("annotations", "field"),
    [
        ({a.VRAM_LIMIT: "lots"}, a.VRAM_LIMIT),
        ({a.COMPUTE_LIMIT: "150"}, a.COMPUTE_LIMIT),
        ({a.COMPUTE_LIMIT: "0"}, a.COMPUTE_LIMIT),
        ({a.GPU_IDS: "0,0"}, a.GPU_IDS),
        ({a.GPU_IDS: "7"}, a.GPU_IDS),
        ({a.QOS: "urgent"}, a.QOS),
        ({a.VRAM_OVERSUBSCRIBE: "maybe"}, a.VRAM_OVERSUBSCRIBE),
        ({a.PREFIX + "vram-limt": "1Gi"}, a.PREFIX + "vram-limt"),
        ({a.VRAM_LIMIT + ".5": "1Gi"}, a.VRAM_LIMIT + ".5"),
        ({a.COMPUTE_LIMIT: "50", a.COMPUTE_BURST: "20"}, a.COMPUTE_BURST),
    ],
)
def test_bad_values_are_one_line_problems_naming_pod_and_field(
    annotations: dict[str, str], field: str
) -> None:
    problems = r.resolve(pod(annotations), GPUS).problems
    assert problems
    for problem in problems:
        assert problem.startswith(f"pod ml/train: {field}=") and "\n" not in problem


def test_a_bad_resource_quantity_is_a_problem() -> None:
    (problem,) = r.resolve(pod({}, {"vgpu.io/gpu-memory": "2Gi"}), GPUS).problems
    assert "container c0 resource vgpu.io/gpu-memory" in problem


def test_peak_table_matches_specific_names_first() -> None:
    assert a.peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert a.peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert a.peak_tflops("NVIDIA L40S") == 362.0
    assert a.peak_tflops("Something else") is None


# Parsers: every input gives a value in range or a ValueError, never another exception
# (the shared ones, vgpu_common.limits', are checked in tests/common/test_limits.py).


@given(st.text(max_size=60))
def test_gpu_ids_parser_is_total(text: str) -> None:
    try:
        ids = a.parse_gpu_ids(text)
    except ValueError:
        return
    assert ids and len({i.lower() for i in ids}) == len(ids)


@given(st.lists(st.integers(0, 15), min_size=1, max_size=8, unique=True), st.booleans())
def test_gpu_ids_round_trip(indices: list[int], spaces: bool) -> None:
    text = (", " if spaces else ",").join(map(str, indices))
    assert a.parse_gpu_ids(text) == tuple(map(str, indices))


@given(st.text(max_size=12))
def test_quantity_and_switch_parsers_are_total(text: str) -> None:
    for parse in (parse_quantity, parse_switch, a.parse_tflops):
        with contextlib.suppress(ValueError):
            parse(text)


@given(
    st.dictionaries(
        st.sampled_from([*a.ANNOTATIONS, a.VRAM_LIMIT + ".0", a.COMPUTE_LIMIT + ".1"]),
        st.text(max_size=12),
    ),
    st.dictionaries(
        st.sampled_from(["vgpu.io/gpu", "vgpu.io/gpu-memory", "vgpu.io/gpu-compute"]),
        st.text(max_size=6),
    ),
)
def test_resolve_never_raises_and_limits_stay_in_range(
    annotations: dict[str, str], resources: dict[str, str]
) -> None:
    found = r.resolve(pod(annotations, resources), GPUS)
    for limits in found.gpus.values():
        bytes_, hundredths = known(limits.memory), known(limits.compute)
        assert bytes_ is None or bytes_ > 0
        assert hundredths is None or 1 <= hundredths < WHOLE_GPU
