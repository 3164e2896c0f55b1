"""Request math against upstream's TestPodResourceRequests cases (kubelet-admission-spec §4.1, §4.2)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers.builders import container
from webhook.kube.errors import FieldError
from webhook.kube.resources import is_extended_resource, is_scalar_resource, pod_requests, qos_class


def sidecar(cpu):
    return container(f"sidecar-{cpu}", requests={"cpu": cpu}, restartPolicy="Always")


def init(cpu):
    return container(f"init-{cpu}", requests={"cpu": cpu})


def test_sidecar_init_container_requests_add_to_app_containers():
    spec = {
        "initContainers": [init("5"), sidecar("1"), sidecar("2"), sidecar("3")],
        "containers": [container(requests={"cpu": "1"})],
    }
    assert pod_requests(spec)["cpu"] == 7000


def test_regular_init_container_runs_next_to_the_sidecars_declared_before_it():
    spec = {
        "initContainers": [init("5"), sidecar("1"), sidecar("2"), init("5"), sidecar("3")],
        "containers": [container(requests={"cpu": "1"})],
    }
    assert pod_requests(spec)["cpu"] == 8000


def test_largest_init_container_plus_earlier_sidecars_can_dominate():
    spec = {
        "initContainers": [sidecar("10"), init("200")],
        "containers": [container(requests={"cpu": "100"})],
    }
    assert pod_requests(spec)["cpu"] == 210000


def test_limits_stand_in_for_missing_requests():
    spec = {"containers": [container(limits={"cpu": "2", "nvidia.com/gpu": "1"}, requests={"cpu": "500m"})]}
    assert pod_requests(spec) == {"cpu": 500, "nvidia.com/gpu": 1}


def test_pod_level_requests_replace_cpu_and_memory_but_not_extended_resources():
    spec = {
        "resources": {"requests": {"cpu": "3", "memory": "1Gi"}},
        "containers": [container(requests={"cpu": "1", "memory": "2Gi", "example.com/foo": "2"})],
    }
    assert pod_requests(spec) == {"cpu": 3000, "memory": 1024**3, "example.com/foo": 2}


def test_overhead_is_added_on_top():
    spec = {"overhead": {"cpu": "250m", "memory": "120Mi"}, "containers": [container(requests={"cpu": "1"})]}
    assert pod_requests(spec) == {"cpu": 1250, "memory": 120 * 1024**2}


def test_resized_pod_is_charged_the_largest_of_spec_allocated_and_actuated():
    spec = {"containers": [container("app", requests={"cpu": "1", "memory": "1Gi"})]}
    status = {
        "phase": "Running",
        "containerStatuses": [
            {
                "name": "app",
                "allocatedResources": {"cpu": "2", "memory": "512Mi"},
                "resources": {"requests": {"cpu": "1500m", "memory": "2Gi"}},
            }
        ],
    }
    assert pod_requests(spec, status) == {"cpu": 2000, "memory": 2 * 1024**3}


def test_infeasible_resize_ignores_the_spec():
    spec = {"containers": [container("app", requests={"cpu": "8"})]}
    status = {
        "conditions": [{"type": "PodResizePending", "reason": "Infeasible"}],
        "containerStatuses": [{"name": "app", "allocatedResources": {"cpu": "1"}}],
    }
    assert pod_requests(spec, status) == {"cpu": 1000}


def test_ephemeral_containers_never_count():
    spec = {
        "containers": [container(requests={"cpu": "1"})],
        "ephemeralContainers": [container("debug", requests={"cpu": "100"})],
    }
    assert pod_requests(spec) == {"cpu": 1000}


def test_malformed_quantity_names_the_field():
    spec = {"containers": [container(), container("b", requests={"memory": "lots"})]}
    with pytest.raises(FieldError) as err:
        pod_requests(spec)
    assert err.value.field == "spec.containers[1].resources.requests.memory"


cpu_amounts = st.integers(min_value=0, max_value=64000)


@given(st.lists(cpu_amounts, min_size=1, max_size=5), st.lists(cpu_amounts, max_size=5))
def test_without_sidecars_request_is_max_of_app_sum_and_largest_init(apps, inits):
    spec = {
        "containers": [container(f"a{i}", requests={"cpu": f"{m}m"}) for i, m in enumerate(apps)],
        "initContainers": [container(f"i{i}", requests={"cpu": f"{m}m"}) for i, m in enumerate(inits)],
    }
    assert pod_requests(spec)["cpu"] == max(sum(apps), max(inits, default=0))


@given(st.lists(cpu_amounts, max_size=4), st.lists(cpu_amounts, min_size=1, max_size=4))
def test_sidecars_always_add_to_the_app_sum(sidecars, apps):
    spec = {
        "initContainers": [sidecar(f"{m}m") | {"name": f"s{i}"} for i, m in enumerate(sidecars)],
        "containers": [container(f"a{i}", requests={"cpu": f"{m}m"}) for i, m in enumerate(apps)],
    }
    assert pod_requests(spec)["cpu"] == sum(sidecars) + sum(apps)


@pytest.mark.parametrize(
    ("name", "extended", "scalar"),
    [
        ("cpu", False, False),
        ("nvidia.com/gpu", True, True),
        ("hugepages-2Mi", False, True),
        ("kubernetes.io/batch-cpu", False, True),
        ("requests.nvidia.com/gpu", False, False),
        ("attachable-volumes-aws-ebs", False, True),
    ],
)
def test_resource_name_classes_follow_v1helper(name, extended, scalar):
    assert is_extended_resource(name) is extended
    assert is_scalar_resource(name) is scalar


def test_qos_classes():
    assert qos_class({"containers": [container()]}) == "BestEffort"
    assert qos_class({"containers": [container(requests={"nvidia.com/gpu": "1"})]}) == "BestEffort"
    assert qos_class({"containers": [container(requests={"cpu": "1"})]}) == "Burstable"
    assert qos_class({"containers": [container(limits={"cpu": "1", "memory": "1Gi"})]}) == "Guaranteed"
