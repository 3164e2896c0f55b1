"""One verdict on every face (issue 29), through the installed console script: what ``check``,
``explain``, ``audit`` and ``test`` say agrees with what the server decides."""

from __future__ import annotations

import pytest

from tests.test_console_script import cli

# -- 3. operators' kinds get NoClusterState like built-in controllers --------------------------

GPU_CONTAINERS = "[{name: t, image: t, resources: {limits: {nvidia.com/gpu: 1}}}]"
OPERATOR_GPU_WORKLOADS = {
    "PyTorchJob": f"""\
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {{name: train, namespace: ml}}
spec:
  pytorchReplicaSpecs:
    Worker: {{replicas: 2, template: {{spec: {{containers: {GPU_CONTAINERS}}}}}}}
""",
    "VolcanoJob": f"""\
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {{name: train, namespace: ml}}
spec:
  tasks: [{{name: w, replicas: 2, template: {{spec: {{containers: {GPU_CONTAINERS}}}}}}}]
""",
    "RayCluster": f"""\
apiVersion: ray.io/v1
kind: RayCluster
metadata: {{name: train, namespace: ml}}
spec:
  headGroupSpec: {{template: {{spec: {{containers: [{{name: h, image: h}}]}}}}}}
  workerGroupSpecs: [{{groupName: g, template: {{spec: {{containers: {GPU_CONTAINERS}}}}}}}]
""",
}


@pytest.mark.parametrize("kind", sorted(OPERATOR_GPU_WORKLOADS))
def test_without_a_cluster_an_operators_gpu_workload_warns_that_device_ownership_was_not_checked(kind):
    manifest = OPERATOR_GPU_WORKLOADS[kind]
    result = cli("check", "-f", "-", stdin=manifest)
    assert result.returncode == 0, result.stderr
    assert "[deviceScheduler] NoClusterState:" in result.stdout, result.stdout
    assert "device ownership was not checked" in result.stdout
    assert cli("check", "-f", "-", "--warnings-as-errors", stdin=manifest).returncode == 1
