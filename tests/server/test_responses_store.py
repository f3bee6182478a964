"""The store of /v1/responses answers (``responses_store``) on its own, and a server that stores
none (``--responses-store-size 0``), without an engine: its answers come before one is asked."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from minisgl_core.server.api_options import ApiOptions
from minisgl_core.server.app import create_app
from minisgl_core.server.responses_store import ResponseStore
from minisgl_core.server.state import ModelInfo, ServerState

from .conftest import API_KEY


def response(rid: str, text: str = "hi") -> dict:
    return {"id": rid, "object": "response", "output": [{"type": "message", "content": text}]}


def test_the_oldest_response_goes_first_past_the_count():
    store = ResponseStore(max_responses=2)
    for rid in ("resp_a", "resp_b", "resp_c"):
        store.put(response(rid), [{"type": "message", "role": "user", "content": rid}])
    assert store.get("resp_a") is None and len(store) == 2
    assert json.loads(store.get("resp_b").response) == response("resp_b")
    assert store.conversation("resp_c") == [
        {"type": "message", "role": "user", "content": "resp_c"},
        {"type": "message", "content": "hi"},
    ]
    assert store.delete("resp_b") and not store.delete("resp_b") and len(store) == 1


def test_the_oldest_responses_go_first_past_the_characters():
    one = ResponseStore(max_responses=100)
    one.put(response("resp_a", "x" * 100), [])
    size = one.chars
    store = ResponseStore(max_responses=100, max_chars=2 * size + 10)
    for rid in ("resp_a", "resp_b", "resp_c"):
        store.put(response(rid, "x" * 100), [])
    assert [rid for rid in ("resp_a", "resp_b", "resp_c") if store.get(rid)] == ["resp_b", "resp_c"]
    assert store.chars == 2 * size
    # one larger than the whole store is not kept, and evicts nothing
    store.put(response("resp_big", "x" * 1000), [])
    assert store.get("resp_big") is None and len(store) == 2
    store.delete("resp_b")
    store.delete("resp_c")
    assert store.chars == 0


OPS = st.lists(
    st.tuples(st.sampled_from(["put", "delete"]), st.integers(0, 9), st.integers(0, 300)), max_size=60
)


@settings(max_examples=200, deadline=None)
@given(ops=OPS, max_responses=st.integers(1, 5), max_chars=st.integers(150, 1500))
def test_the_store_keeps_the_latest_responses_within_both_bounds(ops, max_responses, max_chars):
    """Whatever the puts and deletes: the store holds the latest puts not deleted since, as many
    as fit both bounds taken newest first, and counts their characters exactly."""
    store = ResponseStore(max_responses, max_chars)
    sizes: dict[str, int] = {}
    latest: list[str] = []  # ids put and not deleted since, oldest first
    for op, n, length in ops:
        rid = f"resp_{n}"
        if rid in latest:
            latest.remove(rid)
        if op == "delete":
            store.delete(rid)
            continue
        store.put(response(rid, "x" * length), [])
        sizes[rid] = len(json.dumps(response(rid, "x" * length))) + len("[]")
        if sizes[rid] > max_chars:
            continue  # never kept (and nothing evicted for it)
        latest.append(rid)
        # what the store must still hold: the newest, as many as fit
        kept, chars = [], 0
        for other in reversed(latest):
            if len(kept) == max_responses or chars + sizes[other] > max_chars:
                break
            kept.append(other)
            chars += sizes[other]
        latest = kept[::-1]
    held = [f"resp_{n}" for n in range(10) if store.get(f"resp_{n}") is not None]
    assert sorted(held) == sorted(latest) and len(store) == len(latest)
    assert store.chars == sum(sizes[rid] for rid in latest) <= max_chars


def test_a_store_of_size_0_keeps_nothing():
    store = ResponseStore(max_responses=0)
    store.put(response("resp_a"), [])
    assert not store.enabled and store.get("resp_a") is None and len(store) == 0


@pytest.fixture(scope="module")
def unstored() -> TestClient:
    info = ModelInfo(name="m", path="m", max_context_len=2048, kv_capacity_tokens=16384, vocab_size=1024)
    state = ServerState(endpoints=None, model=info)
    app = create_app(state, api_key=API_KEY, options=ApiOptions(responses_store_size=0))
    return TestClient(app, headers={"Authorization": f"Bearer {API_KEY}"})


def test_with_storing_off_get_and_previous_response_id_name_the_option(unstored):
    for method in ("GET", "DELETE"):
        missing = unstored.request(method, "/v1/responses/resp_1")
        assert missing.status_code == 404
        assert "--responses-store-size 0" in missing.json()["error"]["message"]
    refused = unstored.post("/v1/responses", json={"input": "Hi", "previous_response_id": "resp_1"})
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["param"] == "previous_response_id" and "--responses-store-size 0" in error["message"]
