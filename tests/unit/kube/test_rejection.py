"""Which Failed pods count as kubelet admission rejections (the storm breaker's and audit's input)."""

import pytest

from webhook.kube.rejection import Owner, admission_rejection, controller_owner


def failed(reason, message=""):
    return {"status": {"phase": "Failed", "reason": reason, "message": message}}


@pytest.mark.parametrize(
    "reason",
    [
        "OutOfcpu",
        "OutOfnvidia.com/gpu",
        "UnexpectedAdmissionError",
        "TopologyAffinityError",
        "NodeAffinity",
        "SysctlForbidden",
        "TaintToleration",
        "NodePorts",
    ],
)
def test_kubelet_admission_reasons_are_rejections(reason):
    assert admission_rejection(failed(reason, f"Pod was rejected: {reason}")).reason == reason


def test_any_reason_with_the_rejected_prefix_is_a_rejection():
    rejection = admission_rejection(failed("SomeNewHandler", "Pod was rejected: a new admit handler said no"))
    assert rejection.reason == "SomeNewHandler"


def test_pressure_rejection_counts_but_eviction_of_a_running_pod_does_not():
    assert admission_rejection(
        failed("Evicted", "Pod was rejected: The node had condition: [DiskPressure]. ")
    )
    assert admission_rejection(failed("Evicted", "The node was low on resource: memory.")) is None


@pytest.mark.parametrize("reason", ["DeadlineExceeded", "Error", "", "OutOf"])
def test_container_failures_and_deadlines_are_not_rejections(reason):
    assert admission_rejection(failed(reason, "container exited with 1")) is None


def test_pods_that_are_not_failed_are_not_rejections():
    assert admission_rejection({"status": {"phase": "Pending", "reason": "OutOfcpu"}}) is None
    assert admission_rejection({}) is None


def test_controller_owner_is_the_reference_marked_controller():
    pod = {
        "metadata": {
            "namespace": "ml",
            "ownerReferences": [
                {"kind": "Other", "name": "x", "uid": "u0"},
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "web-1",
                    "uid": "u1",
                    "controller": True,
                },
            ],
        }
    }
    assert controller_owner(pod) == Owner("u1", "ReplicaSet", "web-1", "ml", "apps/v1")
    assert controller_owner({"metadata": {"name": "bare"}}) is None
