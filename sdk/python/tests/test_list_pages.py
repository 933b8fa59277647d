"""Lists read from the server a page at a time: the pieces that need no
server, and the async list against one."""

from __future__ import annotations

import uuid

import pytest

from pandastack import AsyncSandbox, InvalidRequestError, PandaStackError
from pandastack._base import list_params, next_page, unpaged_server


def test_next_page_ends_and_refuses_a_list_without_end():
    assert next_page({"sandboxes": [{}]}, None) is None
    assert next_page({"sandboxes": [{}], "next": "p2"}, None) == "p2"
    with pytest.raises(PandaStackError, match="never end"):
        next_page({"sandboxes": [{}], "next": "p2"}, "p2")
    with pytest.raises(PandaStackError, match="never end"):
        next_page({"sandboxes": [], "next": "p3"}, "p2")


def test_a_server_from_before_pages_is_asked_without_them():
    old = InvalidRequestError('unknown query parameter "limit"; filter with metadata.<key>=<value> or state=', code="invalid_request", status=400)
    assert unpaged_server(old, None)
    assert not unpaged_server(old, "p2")  # it gave a next: it has pages
    assert not unpaged_server(InvalidRequestError('state must be starting, ... got "x"', code="invalid_request"), None)
    assert list_params({"k": "v"}, "all", paged=False) == [("metadata.k", "v"), ("state", "all")]
    assert ("limit", "500") in list_params(None, None)


@pytest.mark.anyio
async def test_async_list_reads_every_page(server, monkeypatch):
    import pandastack._base as base

    monkeypatch.setattr(base, "LIST_PAGE", 2)
    tag = uuid.uuid4().hex
    made = []
    try:
        for _ in range(3):
            made.append(await AsyncSandbox.create(ttl_seconds=120, metadata={"tag": tag}))
        assert [s.id for s in await AsyncSandbox.list(metadata={"tag": tag})] == [s.id for s in made]
    finally:
        for s in made:
            await s.kill()
    assert await AsyncSandbox.list(metadata={"tag": tag}) == []
