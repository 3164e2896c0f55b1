"""A list's pages: the next one is asked for while this one is applied."""

from __future__ import annotations

import orjson
import pytest

from tests.helpers.informer import eventually
from webhook.state.apiserver import ApiError, Page
from webhook.state.informer import Informer, Timing, _kinds


class PagedApi:
    """Pages named "", "t1", "t2", each naming the next; ``fail``: the one that fails. A page
    asked for ahead is asked for as its body (``page_body``), the others as a page."""

    def __init__(self, fail: str | None = None, streamed: bool = False, too_large: str = "") -> None:
        self.asked: list[str] = []
        self.fail, self.streamed, self.too_large = fail, streamed, too_large

    def list_page(self, resource, limit, token="", timeout=60, decode=None) -> Page:
        items, version, following = self._page(token)
        return Page(iter(items) if self.streamed else items, version, following)

    def page_body(self, resource, limit, token="", timeout=60) -> bytes | None:
        items, version, following = self._page(token)
        if token == self.too_large:
            return None
        metadata = {"resourceVersion": version, **({"continue": following} if following else {})}
        return orjson.dumps({"metadata": metadata, "items": items})

    def _page(self, token: str) -> tuple[list, str, str]:
        self.asked.append(token)
        if token == self.fail:
            raise ApiError(410, "the provided continue parameter is too old")
        following = {"": "t1", "t1": "t2", "t2": ""}[token]
        pod = {"metadata": {"name": f"pod-{token or 't0'}", "uid": token or "t0"}, "spec": {"nodeName": "n"}}
        return [pod], "5", following


def pods_kind(informer: Informer):
    return next(kind for kind in _kinds(informer.state) if kind.name == "pods")


def test_the_next_page_is_asked_for_while_this_one_is_applied():
    api = PagedApi()
    informer = Informer(api, Timing(page_size=1))
    pages = informer._pages(pods_kind(informer))
    first = next(pages)
    assert first.continue_token == "t1"
    assert eventually(lambda: api.asked == ["", "t1"])  # before the caller is done with the first
    assert [page.continue_token for page in pages] == ["t2", ""]
    assert api.asked == ["", "t1", "t2"]


def test_a_streamed_page_names_the_next_only_once_read_so_nothing_is_asked_ahead():
    api = PagedApi(streamed=True)
    informer = Informer(api, Timing(page_size=1))
    pages = informer._pages(pods_kind(informer))
    next(pages)
    assert api.asked == [""]
    assert len(list(pages)) == 2


def test_a_page_asked_for_ahead_that_fails_fails_the_list():
    api = PagedApi(fail="t1")
    informer = Informer(api, Timing(page_size=1))
    with pytest.raises(ApiError, match="too old"):
        list(informer._pages(pods_kind(informer)))


def test_a_list_read_ahead_holds_every_pod_of_every_page():
    informer = Informer(PagedApi(), Timing(page_size=1))
    informer._list(pods_kind(informer))
    assert sorted(informer.state.pods) == ["t0", "t1", "t2"]


def test_a_body_asked_for_ahead_too_large_to_read_whole_is_asked_for_again_streamed():
    api = PagedApi(too_large="t1")
    informer = Informer(api, Timing(page_size=1))
    informer._list(pods_kind(informer))
    assert api.asked == ["", "t1", "t1", "t2"]
    assert sorted(informer.state.pods) == ["t0", "t1", "t2"]
