"""Pods of every shape a pod's record reads, odd JSON types included (hypothesis strategies):
what the typed decode of a list page, and a list forked to a child, must read as its parsed
JSON reads."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from webhook.state.model import MIRROR_ANNOTATION

ODD = st.one_of(st.integers(-3, 3), st.booleans(), st.just("x"), st.just([1]), st.just({"k": 1}))
QUANTITY = st.sampled_from(["100m", "1", "2Gi", "0", "1.5", "abc", "-1", 3, 0.5])
RESOURCE = st.sampled_from(["cpu", "memory", "nvidia.com/gpu", "example.com/fpga", "hugepages-2Mi", "pods"])
RESOURCE_LIST = st.dictionaries(RESOURCE, QUANTITY, max_size=3)


def maybe(strategy, odd):
    """Mostly ``strategy``; sometimes absent or null (None here: ``present`` drops it), or odd."""
    return st.one_of(strategy, strategy, strategy, st.none(), odd)


def present(**fields: Any) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


@st.composite
def containers(draw, odd) -> list[Any]:
    made = []
    for _ in range(draw(st.integers(0, 3))):
        resources = draw(
            maybe(
                st.fixed_dictionaries({}, optional={"requests": RESOURCE_LIST, "limits": RESOURCE_LIST}), odd
            )
        )
        ports = draw(maybe(st.lists(st.fixed_dictionaries(
            {"containerPort": st.sampled_from([80, 8080])},
            optional={
                "hostPort": st.sampled_from([0, 80, 9090, "x"]),
                "protocol": st.sampled_from(["TCP", "UDP"]),
            },
        ), max_size=2), odd))  # fmt: skip
        made.append(present(
            name=draw(maybe(st.sampled_from(["app", "side", "init"]), odd)),
            restartPolicy=draw(maybe(st.sampled_from(["Always", "Never"]), odd)),
            resources=resources,
            ports=ports,
            image="registry.example/app:1",
        ))  # fmt: skip
    return made if draw(st.integers(0, 20)) else draw(st.one_of(st.just(made), odd))


@st.composite
def pods(draw, odd_types: bool = True) -> dict[str, Any]:
    """Pods; one in four with fields of another JSON type here and there (``odd_types``), so
    that most pages decode typed."""
    with_odd = odd_types and draw(st.integers(0, 3)) == 0
    odd = ODD if with_odd else st.nothing()
    odd_priority = st.one_of(ODD, st.sampled_from([True, 1.0, "1", 2**70])) if with_odd else st.nothing()
    annotations = draw(
        maybe(st.sampled_from([{}, {MIRROR_ANNOTATION: "x"}, {MIRROR_ANNOTATION: None}, {"a": "b"}]), odd)
    )
    metadata = present(
        name=draw(maybe(st.sampled_from(["p", "web-0", ""]), odd)),
        generateName=draw(maybe(st.just("web-"), odd)),
        namespace=draw(maybe(st.sampled_from(["default", "team-a", ""]), odd)),
        uid=draw(maybe(st.sampled_from(["uid-1", "uid-2", ""]), odd)),
        labels=draw(maybe(st.just({"app": "web"}), odd)),
        annotations=annotations,
    )
    statuses = draw(maybe(st.lists(st.fixed_dictionaries(
        {"name": maybe(st.sampled_from(["app", "side"]), odd)},
        optional={
            "allocatedResources": RESOURCE_LIST,
            "resources": st.fixed_dictionaries({"requests": RESOURCE_LIST}),
        },
    ), max_size=2), odd))  # fmt: skip
    conditions = draw(maybe(st.lists(st.fixed_dictionaries({
        "type": st.sampled_from(["Ready", "PodResizePending"]),
        "reason": st.sampled_from(["Infeasible", "Deferred"]),
    }), max_size=2), odd))  # fmt: skip
    spec = present(
        nodeName=draw(maybe(st.sampled_from(["node-1", "node-2", ""]), odd)),
        schedulerName=draw(maybe(st.sampled_from(["default-scheduler", "volcano", ""]), odd)),
        priority=draw(
            maybe(
                st.sampled_from([0, 1000, 2_000_000_000, 2**40]),
                odd_priority,
            )
        ),
        containers=draw(containers(odd)),
        initContainers=draw(maybe(containers(odd), odd)),
        resources=draw(
            maybe(
                st.fixed_dictionaries({}, optional={"requests": RESOURCE_LIST, "limits": RESOURCE_LIST}), odd
            )
        ),
        overhead=draw(maybe(RESOURCE_LIST, odd)),
        nodeSelector=draw(maybe(st.just({"zone": "a"}), odd)),
        affinity=draw(maybe(st.just({}), odd)),
        tolerations=draw(maybe(st.lists(st.just({"operator": "Exists"}), max_size=1), odd)),
    )
    status = present(
        phase=draw(maybe(st.sampled_from(["Running", "Pending", "Succeeded", "Failed"]), odd)),
        containerStatuses=statuses,
        conditions=conditions,
    )
    return present(
        apiVersion="v1",
        kind="Pod",
        metadata=draw(maybe(st.just(metadata), odd)),
        spec=draw(maybe(st.just(spec), odd)),
        status=draw(maybe(st.just(status), odd)),
    )
