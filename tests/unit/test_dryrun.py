"""What ``check`` refuses as input before judging: templates a chart has not rendered."""

import pytest

from webhook.dryrun import unrendered
from webhook.kube.errors import FieldError


def deployment(container: dict) -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "annotations": {"note": "{{ .Values.note }}"}},
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {"name": "app", "image": "web:1"},
                        {"name": "proxy", "image": "proxy:1", **container},
                    ]
                }
            }
        },
    }


def test_an_unrendered_template_deep_in_a_pod_template_is_named_by_its_full_path():
    with pytest.raises(FieldError) as err:
        unrendered(deployment({"ports": [{"containerPort": 80}, {"name": "{{ .Values.port }}"}]}))
    assert err.value.field == "spec.template.spec.containers[1].ports[1].name"
    assert "'{{ .Values.port }}' is an unrendered Helm template" in str(err.value)


@pytest.mark.parametrize(
    "container",
    [
        {"command": ["sh", "-c", "echo {{ x }}"]},
        {"args": ["--format={{ .Name }}"]},
        {"env": [{"name": "T", "value": "{{ y }}"}]},
    ],
    ids=["command", "args", "env"],
)
def test_templates_where_programs_keep_their_own_are_not_input_errors(container):
    unrendered(deployment(container))
