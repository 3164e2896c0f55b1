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
