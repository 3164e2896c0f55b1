import pytest
from hypothesis import given
from hypothesis import strategies as st

from webhook.config import Config, ConfigError, config_from_dict, globs_overlap, load_config


def error_of(data) -> str:
    with pytest.raises(ConfigError) as err:
        config_from_dict(data, "guard.yaml")
    return str(err.value)


def test_no_config_means_every_policy_enforces():
    cfg = config_from_dict({})
    assert cfg == Config()
    assert {cfg.mode(p) for p in ("pinnedNodeName", "deviceScheduler", "nodeAdmission")} == {"enforce"}


def test_errors_name_the_source_and_field():
    assert error_of({"policies": {"pinnedNodeName": {"mode": "block"}}}) == (
        "guard.yaml: policies.pinnedNodeName.mode: 'block' is not one of enforce, warn, audit, fix, off"
    )
    assert "policies.nodeAdmission.mode" in error_of({"policies": {"nodeAdmission": {"mode": "fix"}}})
    assert "failOpen: must be true or false" in error_of({"failOpen": "yes"})
    assert "policies.deviceSchedular: unknown field" in error_of({"policies": {"deviceSchedular": {}}})
    assert "exemptions[0]: needs at least one of" in error_of({"exemptions": [{}]})


def test_overlapping_owner_patterns_with_different_owners_are_an_error():
    message = error_of(
        {"policies": {"deviceScheduler": {"owners": {"nvidia.com/*": "volcano", "nvidia.com/gpu": "kai"}}}}
    )
    assert (
        "'nvidia.com/*' (owner volcano) and 'nvidia.com/gpu' (owner kai) match the same resource" in message
    )
    same_owner = {"policies": {"deviceScheduler": {"owners": {"nvidia.com/*": "v", "nvidia.com/gpu": "v"}}}}
    assert config_from_dict(same_owner).device_scheduler.configured_owner("nvidia.com/gpu") == "v"


def test_load_config_reports_invalid_yaml_with_the_path(tmp_path):
    path = tmp_path / "guard.yaml"
    path.write_text("policies: [unclosed\n")
    with pytest.raises(ConfigError, match=r"guard\.yaml: invalid YAML"):
        load_config(path)


glob = st.text(alphabet="ab*?", max_size=6)


@given(glob, glob, st.text(alphabet="ab", max_size=8))
def test_globs_overlap_whenever_one_string_matches_both(first, second, text):
    from fnmatch import fnmatchcase

    if fnmatchcase(text, first) and fnmatchcase(text, second):
        assert globs_overlap(first, second)


def test_disjoint_globs_do_not_overlap():
    assert not globs_overlap("nvidia.com/*", "amd.com/*")
    assert globs_overlap("*/gpu", "nvidia.com/*")


@pytest.mark.parametrize("value", ["off", "'off'", "false", "no"])
def test_a_bare_off_means_the_mode_off(tmp_path, value):
    path = tmp_path / "guard.yaml"
    path.write_text(f"policies:\n  pinnedNodeName: {{mode: {value}}}\n")
    assert load_config(path).pinned_node_name.mode == "off"


def test_true_is_not_a_mode_and_the_error_says_why(tmp_path):
    path = tmp_path / "guard.yaml"
    path.write_text("policies:\n  deviceScheduler: {mode: on}\n")
    with pytest.raises(ConfigError, match=r"policies\.deviceScheduler\.mode: true is not a mode: YAML reads"):
        load_config(path)


def test_every_config_problem_is_listed_at_once():
    with pytest.raises(ConfigError) as err:
        config_from_dict(
            {
                "failOpen": "sometimes",
                "excludedNamespaces": "kube-system",
                "policies": {"pinnedNodeName": {"mode": "loud"}, "nodeAdmission": {"unknownNode": "maybe"}},
                "typo": 1,
            }
        )
    message = str(err.value)
    assert "5 problems" in message
    for field in ("failOpen", "excludedNamespaces", "pinnedNodeName.mode", "unknownNode", "typo"):
        assert field in message


def test_a_duplicate_key_in_the_config_is_an_error(tmp_path):
    path = tmp_path / "guard.yaml"
    path.write_text("failOpen: true\nfailOpen: false\n")
    with pytest.raises(ConfigError, match="duplicate key 'failOpen'"):
        load_config(path)


@pytest.mark.parametrize("value", ["off", "'off'", "false", "no"])
@pytest.mark.parametrize("policy", ["pinnedNodeName", "deviceScheduler", "nodeAdmission", "stormBreaker"])
def test_a_bare_off_policy_is_the_mode_off(tmp_path, policy, value):
    path = tmp_path / "guard.yaml"
    path.write_text(f"policies:\n  {policy}: {value}\n")
    assert load_config(path).mode(policy) == "off"


def test_a_policy_that_is_neither_off_nor_a_mapping_is_an_error_naming_it():
    policies = {"pinnedNodeName": True, "deviceScheduler": "warn", "nodeAdmission": 0, "stormBreaker": []}
    message = error_of({"policies": policies})
    assert "4 problems" in message
    assert "policies.pinnedNodeName: true (YAML reads a bare on/yes/true as true) is not a policy" in message
    for shown in ("deviceScheduler: 'warn'", "nodeAdmission: 0", "stormBreaker: []"):
        assert f"policies.{shown} is not a policy setting" in message
    assert config_from_dict({"policies": {"pinnedNodeName": None}}) == Config()
