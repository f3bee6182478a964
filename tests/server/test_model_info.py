"""ModelInfo: what the ready handshake said about the served model, and what the routes derive
from it once (max_model_len), answered without an engine."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from minisgl_core.server.app import create_app
from minisgl_core.server.state import ModelInfo, ServerState


@pytest.mark.parametrize(("context", "pool", "longest"), [(2048, 16384, 2048), (2048, 1024, 1024)])
def test_max_model_len_is_the_context_or_the_smaller_kv_pool(context, pool, longest):
    info = ModelInfo(name="m", path="m", max_context_len=context, kv_capacity_tokens=pool, vocab_size=1024)
    assert info.max_model_len == longest
    client = TestClient(create_app(ServerState(endpoints=None, model=info)))
    assert client.get("/v1/models").json()["data"][0]["max_model_len"] == longest


def test_every_served_name_is_listed_and_answers_a_request():
    """--served-model-name a b: /v1/models lists both (as vLLM lists its names), either finds the
    model, and a 404 names them all."""
    from minisgl_core.server.errors import APIError

    info = ModelInfo(
        name="a", path="/m/a", max_context_len=64, kv_capacity_tokens=64, vocab_size=8, aliases=("b",)
    )
    client = TestClient(create_app(ServerState(endpoints=None, model=info)))
    assert [card["id"] for card in client.get("/v1/models").json()["data"]] == ["a", "b"]
    assert client.get("/v1/models/b").json()["id"] == "b"
    assert client.get("/v1/models/a").json()["id"] == "a"
    assert client.get("/v1/models//m/a").json()["id"] == "a"  # (its path finds it too, as before)
    for name in ("a", "b", "/m/a", None):
        info.check_name(name)
    with pytest.raises(APIError, match=r"does not exist; this server serves 'a' \(also named 'b'\)"):
        info.check_name("c")
    missing = client.get("/v1/models/c")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
