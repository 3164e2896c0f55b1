"""resourceVersions compare as upstream's CompareResourceVersion (apimachinery, v1.35)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from webhook.kube.resource_version import compare_resource_versions


@given(st.integers(1, 10**30), st.integers(1, 10**30))
def test_well_formed_versions_compare_as_the_integers_they_spell(a, b):
    assert compare_resource_versions(str(a), str(b)) == (a > b) - (a < b)


def test_versions_that_are_not_positive_integers_without_leading_zeros_have_no_order():
    for bad in ("", "0", "012", "-1", "1.5", "abc", "١٢"):
        assert compare_resource_versions(bad, "5") is None
        assert compare_resource_versions("5", bad) is None
