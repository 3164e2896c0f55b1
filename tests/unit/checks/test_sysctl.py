"""The kubelet's sysctl admission (SysctlForbidden), per node, from the upstream tables."""

from __future__ import annotations

import pytest

from tests.helpers.builders import container, deployment, node, pod
from webhook.config import Config, config_from_dict
from webhook.engine import evaluate
from webhook.kube.sysctls import normalize, safe_sysctls
from webhook.state import ClusterState, node_from


def versioned(name: str, kubelet: str = "", kernel: str = "", **kwargs) -> dict:
    obj = node(name, **kwargs)
    obj["status"]["nodeInfo"].update(kubeletVersion=kubelet, kernelVersion=kernel)
    return obj


def cluster(*nodes: dict) -> ClusterState:
    state = ClusterState()
    for obj in nodes:
        state.set_node(node_from(obj))
    return state


def with_sysctls(*names: str, node_name: str = "n1", **spec) -> dict:
    sysctls = [{"name": n, "value": "1"} for n in names]
    return pod("p", node_name=node_name, securityContext={"sysctls": sysctls}, **spec)


def reasons(obj: dict, state: ClusterState, config: Config | None = None) -> list[str]:
    return [v.reason for v in evaluate(obj, "CREATE", state, config or Config()).violations]


@pytest.mark.parametrize(
    ("kubelet", "kernel", "name", "safe"),
    [
        ("v1.35.0", "6.8.0-45-generic", "net.ipv4.tcp_rmem", True),
        ("v1.31.4", "6.8.0-45-generic", "net.ipv4.tcp_rmem", False),  # safe from 1.32
        ("v1.32.0", "4.14.350-1.amzn2.x86_64", "net.ipv4.tcp_wmem", False),  # needs kernel 4.15
        ("v1.28.3", "5.10.0", "net.ipv4.tcp_fin_timeout", False),  # safe from 1.29
        ("v1.29.0", "4.5.0", "net.ipv4.tcp_fin_timeout", False),  # needs kernel 4.6
        ("v1.29.0", "4.6.0", "net.ipv4.tcp_fin_timeout", True),
        ("v1.20.0", "3.10.0", "net.ipv4.ip_local_reserved_ports", False),  # needs kernel 3.16
        ("v1.20.0", "3.10.0", "kernel.shm_rmid_forced", True),
        ("", "", "net.ipv4.tcp_rmem", True),  # no versions reported: the newest set
    ],
)
def test_the_safe_set_follows_the_kubelet_and_kernel_versions(kubelet, kernel, name, safe):
    assert (name in safe_sysctls(kubelet, kernel)) is safe


def test_slash_separated_names_are_normalized_as_the_kubelet_does():
    assert normalize("net/ipv4/conf/eno2.100/rp_filter") == "net.ipv4.conf.eno2/100.rp_filter"
    assert normalize("net.ipv4.tcp_syncookies") == "net.ipv4.tcp_syncookies"


def test_a_safe_sysctl_is_admitted():
    assert (
        reasons(with_sysctls("net.ipv4.tcp_syncookies"), cluster(versioned("n1", "v1.35.0", "6.1.0"))) == []
    )


def test_an_unsafe_sysctl_is_forbidden_with_the_kubelets_message():
    [violation] = evaluate(
        with_sysctls("net.core.somaxconn"), "CREATE", cluster(versioned("n1", "v1.35.0", "6.1.0")), Config()
    ).violations
    assert violation.reason == "SysctlForbidden"
    assert 'forbidden sysctl: "net.core.somaxconn" not allowlisted' in violation.message


def test_net_sysctls_are_refused_with_host_network_and_ipc_ones_with_host_ipc():
    state = cluster(versioned("n1", "v1.35.0", "6.1.0"))
    [net] = evaluate(
        with_sysctls("net.ipv4.tcp_syncookies", hostNetwork=True), "CREATE", state, Config()
    ).violations
    assert 'forbidden sysctl: "net.ipv4.tcp_syncookies" not allowed with host Net enabled' in net.message
    [ipc] = evaluate(
        with_sysctls("kernel.shm_rmid_forced", hostIPC=True), "CREATE", state, Config()
    ).violations
    assert 'forbidden sysctl: "kernel.shm_rmid_forced" not allowed with host IPC enabled' in ipc.message


ALLOW_SOMAXCONN = {
    "policies": {
        "nodeAdmission": {
            "allowedUnsafeSysctls": [
                {"nodeSelector": {"pool": "tuned"}, "sysctls": ["net.core.somaxconn", "kernel.msg*"]}
            ]
        }
    }
}


def test_unsafe_sysctls_allowed_per_node_group_with_prefix_patterns():
    config = config_from_dict(ALLOW_SOMAXCONN)
    tuned = cluster(versioned("n1", "v1.35.0", "6.1.0", labels={"pool": "tuned"}))
    plain = cluster(versioned("n1", "v1.35.0", "6.1.0"))
    assert reasons(with_sysctls("net.core.somaxconn", "kernel.msgmax"), tuned, config) == []
    assert reasons(with_sysctls("net.core.somaxconn"), plain, config) == ["SysctlForbidden"]


def test_an_unsafe_sysctl_no_namespace_isolates_is_a_config_error():
    with pytest.raises(ValueError, match="not a namespaced sysctl"):
        config_from_dict(
            {"policies": {"nodeAdmission": {"allowedUnsafeSysctls": [{"sysctls": ["vm.swappiness"]}]}}}
        )


def test_a_template_is_checked_against_every_node_it_could_be_scheduled_to():
    state = cluster(
        versioned("old", "v1.31.0", "6.1.0", labels={"pool": "a"}),
        versioned("new", "v1.35.0", "6.1.0", labels={"pool": "a"}),
        versioned("elsewhere", "v1.28.0", "6.1.0", labels={"pool": "b"}),
    )
    sysctls = {"sysctls": [{"name": "net.ipv4.tcp_rmem", "value": "4096 87380 6291456"}]}
    template = deployment(
        {"nodeSelector": {"pool": "a"}, "securityContext": sysctls, "containers": [container()]}
    )
    [violation] = evaluate(template, "CREATE", state, Config()).violations
    assert violation.reason == "SysctlForbidden" and "refusing nodes: old)" in violation.message
    only_new = deployment(
        {
            "nodeSelector": {"kubernetes.io/hostname": "new"},
            "securityContext": sysctls,
            "containers": [container()],
        }
    )
    assert evaluate(only_new, "CREATE", state, Config()).violations == []


def test_a_pinned_template_is_checked_on_its_node():
    state = cluster(versioned("n1", "v1.31.0", "6.1.0"))
    sysctls = {"sysctls": [{"name": "net.ipv4.tcp_rmem", "value": "1"}]}
    [violation] = evaluate(
        deployment({"nodeName": "n1", "securityContext": sysctls, "containers": [container()]}),
        "CREATE",
        state,
        Config(),
    ).violations
    assert violation.reason == "PinnedNodeName" and "SysctlForbidden" in violation.message


def test_a_windows_node_allows_only_its_allowed_unsafe_sysctls():
    windows = cluster(versioned("n1", "v1.35.0", "", os="windows", labels={"pool": "tuned"}))
    assert reasons(with_sysctls("kernel.shm_rmid_forced"), windows) == ["SysctlForbidden"]
    assert reasons(with_sysctls("net.core.somaxconn"), windows, config_from_dict(ALLOW_SOMAXCONN)) == []


def test_allowed_unsafe_sysctls_may_be_written_with_slashes_as_the_kubelet_normalizes_them():
    config = config_from_dict(
        {"policies": {"nodeAdmission": {"allowedUnsafeSysctls": [{"sysctls": ["net/core/somaxconn"]}]}}}
    )
    assert (
        reasons(with_sysctls("net.core.somaxconn"), cluster(versioned("n1", "v1.35.0", "6.1.0")), config)
        == []
    )


def template_with(*names: str, **spec) -> dict:
    sysctls = {"sysctls": [{"name": n, "value": "1"} for n in names]}
    return deployment({"securityContext": sysctls, "containers": [container()], **spec})


def test_a_template_ignores_nodes_the_scheduler_would_not_choose():
    state = cluster(
        versioned("worker", "v1.35.0", "6.1.0"),
        versioned("cordoned", "v1.31.0", "6.1.0",
                  taints=[{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]),
        versioned("control-plane", "v1.31.0", "6.1.0",
                  taints=[{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}]),
    )  # fmt: skip
    assert evaluate(template_with("net.ipv4.tcp_rmem"), "CREATE", state, Config()).violations == []
    tolerant = template_with("net.ipv4.tcp_rmem", tolerations=[{"operator": "Exists"}])
    [violation] = evaluate(tolerant, "CREATE", state, Config()).violations
    assert "refusing nodes: cordoned, control-plane)" in violation.message


def test_a_template_is_refused_where_the_kernel_is_below_the_sysctls_minimum():
    state = cluster(versioned("new", "v1.35.0", "6.1.0"), versioned("old-kernel", "v1.35.0", "4.14.0"))
    [violation] = evaluate(template_with("net.ipv4.tcp_rmem"), "CREATE", state, Config()).violations
    assert violation.reason == "SysctlForbidden" and "refusing nodes: old-kernel)" in violation.message


def test_a_template_with_host_network_is_refused_net_sysctls_on_every_node():
    state = cluster(versioned("a", "v1.35.0", "6.1.0"), versioned("b", "v1.35.0", "6.1.0"))
    template = template_with("net.ipv4.tcp_syncookies", hostNetwork=True)
    [violation] = evaluate(template, "CREATE", state, Config()).violations
    assert (
        "not allowed with host Net enabled" in violation.message
        and "refusing nodes: a, b)" in violation.message
    )
    assert evaluate(
        template_with("kernel.shm_rmid_forced", hostIPC=True), "CREATE", state, Config()
    ).violations


def test_a_template_is_admitted_where_its_node_group_allows_the_unsafe_sysctl():
    state = cluster(versioned("t1", "v1.35.0", "6.1.0", labels={"pool": "tuned"}))
    config = config_from_dict(ALLOW_SOMAXCONN)
    assert evaluate(template_with("net.core.somaxconn"), "CREATE", state, config).violations == []
    assert evaluate(template_with("net.core.somaxconn"), "CREATE", state, Config()).violations


def test_an_unbound_pod_is_checked_against_every_node_it_could_be_scheduled_to():
    state = cluster(versioned("new", "v1.35.0", "6.1.0"), versioned("old", "v1.31.0", "6.1.0"))
    unbound = pod("p", securityContext={"sysctls": [{"name": "net.ipv4.tcp_wmem", "value": "1"}]})
    assert reasons(unbound, state) == ["SysctlForbidden"]


def test_a_daemonset_template_is_checked_on_the_cordoned_and_pressured_nodes_its_pods_tolerate():
    state = cluster(
        versioned("worker", "v1.35.0", "6.1.0"),
        versioned("cordoned", "v1.31.0", "6.1.0",
                  taints=[{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]),
    )  # fmt: skip
    daemonset = template_with("net.ipv4.tcp_rmem")
    daemonset["kind"] = "DaemonSet"
    [violation] = evaluate(daemonset, "CREATE", state, Config()).violations
    assert "refusing nodes: cordoned)" in violation.message
