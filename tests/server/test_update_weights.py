"""SGLang's ``POST /update_weights_from_disk``: new weights for the served model from a path (RL
trainers call it between rollouts), loaded beside the served ones and copied in once every rank
has them; a checkpoint that does not fit leaves the old weights serving. The reference for the new
weights is the offline engine started on them; for the old, the server's own answer before.

Two random models of one config (seeds 1 and 2) stand for two training steps.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from minisgl_core.demo.factories import make_model_dir
from minisgl_core.llm import LLM
from minisgl_core.sampling import SamplingParams
from minisgl_core.server.schemas import WEIGHT_UPDATE_ABORT_MESSAGE

from .conftest import API_KEY

AUTH = {"Authorization": f"Bearer {API_KEY}"}
PROMPT = "The quick brown fox jumps over the lazy dog and then"
GREEDY = {"max_new_tokens": 12, "temperature": 0.0, "ignore_eos": True}
#: more tokens than a request makes before the test acts on it (ignore_eos: it cannot stop early)
LONG = {"max_new_tokens": 1500, "ignore_eos": True, "temperature": 0.0}
#: the served context (the models' own): room for a request that runs until the test aborts it
CONTEXT = 32768
#: over a minute of decoding on an idle CPU, aborted once the test has seen what it waits for: the
#: 1,500 tokens of LONG (2 s) ended first on a loaded CI machine
ENDLESS = {"max_new_tokens": CONTEXT - 100, "ignore_eos": True, "temperature": 0.0}
#: the scheduler's line once it holds an update that waits for the engine's requests
UPDATE_WAITS = "requests arriving meanwhile wait for the new weights"


@pytest.fixture(scope="module")
def steps(tmp_path_factory) -> dict[str, Path]:
    """Two checkpoints of one model (two training steps), and one of another shape."""
    root = tmp_path_factory.mktemp("steps")
    context = {"max_position_embeddings": CONTEXT}
    return {
        "a": make_model_dir(root / "step-a", "Qwen3ForCausalLM", seed=1, **context),
        "b": make_model_dir(root / "step-b", "Qwen3ForCausalLM", seed=2, **context),
        "deeper": make_model_dir(root / "deeper", "Qwen3ForCausalLM", seed=3, num_hidden_layers=3, **context),
    }


@pytest.fixture(scope="module")
def reference_b(steps) -> list[int]:
    """The offline engine's greedy tokens on step b's weights."""
    llm = LLM(steps["b"], device="cpu", attn="torch", max_context_len=2048, num_kv_tokens=16384)
    try:
        params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
        return list(llm.generate([PROMPT], params)[0].token_ids)
    finally:
        llm.close()


@pytest.fixture(scope="module")
def served(start_server, steps, engine_args):
    # (a copy of step a: serving from a directory, then updating from others)
    model = steps["a"].parent / "served"
    shutil.copytree(steps["a"], model)
    context = ["--max-context-len", str(CONTEXT), "--num-kv-tokens", str(2 * CONTEXT)]
    return start_server(["--model", str(model), "--api-key", API_KEY, *engine_args, *context])


def update(server, **body: Any) -> httpx.Response:
    return httpx.post(f"{server.url}/update_weights_from_disk", json=body, headers=AUTH, timeout=300)


def generate(
    server, text: str = PROMPT, params: dict[str, Any] = GREEDY, rid: str | None = None
) -> dict[str, Any]:
    body = {"text": text, "sampling_params": params, "rid": rid}
    resp = httpx.post(f"{server.url}/generate", json=body, headers=AUTH, timeout=300)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_new_weights_answer_as_the_offline_engine_on_them(served, steps, reference_b):
    before = generate(served)["output_ids"]
    resp = update(served, model_path=str(steps["b"]), weight_version="step-2", token_step=2)
    assert resp.status_code == 200, resp.text
    assert resp.json() == {
        "success": True,
        "message": f"weights updated from {steps['b']}",
        "num_paused_requests": 0,
    }
    answer = generate(served)
    after = answer["output_ids"]
    assert after == reference_b and after != before
    assert answer["meta_info"]["weight_version"] == "step-2"  # (SGLang's: which weights answered)
    assert httpx.get(f"{served.url}/get_weight_version", headers=AUTH).json() == {"weight_version": "step-2"}
    info = httpx.get(f"{served.url}/get_server_info", headers=AUTH).json()
    assert (info["weight_version"], info["token_step"]) == ("step-2", 2)
    # back to step a: the first answer again, token for token
    assert update(served, model_path=str(steps["a"]), weight_version="step-1").status_code == 200
    assert generate(served)["output_ids"] == before


def test_the_prefix_cache_is_emptied_unless_asked_not_to(served, steps):
    """The cache holds the old weights' keys and values: a prompt cached before is computed anew."""
    text = PROMPT + " once more, at length, so that whole pages of it are cached"
    generate(served, text)
    assert generate(served, text)["meta_info"]["cached_tokens"] > 0
    assert update(served, model_path=str(steps["a"])).status_code == 200
    assert generate(served, text)["meta_info"]["cached_tokens"] == 0
    assert update(served, model_path=str(steps["a"]), flush_cache=False).status_code == 200
    assert generate(served, text)["meta_info"]["cached_tokens"] > 0


@pytest.mark.parametrize(
    ("which", "says"),
    [
        ("deeper", "its config differs from the served model's in "),
        ("missing", "does not exist"),
    ],
)
def test_weights_that_do_not_fit_leave_the_old_ones_serving(served, steps, tmp_path, which, says):
    before = generate(served)["output_ids"]
    path = str(steps["deeper"] if which == "deeper" else tmp_path / "nowhere")
    resp = update(served, model_path=path, weight_version="never")
    assert resp.status_code == 400, resp.text
    body = resp.json()
    assert body["success"] is False and body["num_paused_requests"] == 0
    error = body["error"]
    assert (error["param"], error["code"], error["type"]) == (
        "model_path",
        "weights_not_updated",
        "invalid_request_error",
    )
    assert says in error["message"] and error["message"] == body["message"]
    if which == "deeper":
        assert "num_hidden_layers 3 (served: 2)" in error["message"]
    assert generate(served)["output_ids"] == before
    assert httpx.get(f"{served.url}/get_weight_version", headers=AUTH).json()["weight_version"] != "never"


@pytest.mark.parametrize(
    ("field", "value"),
    [("is_async", True), ("load_format", "pt"), ("model_path", ""), ("model_path", 5), ("surprise", 1)],
)
def test_bad_bodies_are_a_400_naming_the_field(served, steps, field, value):
    resp = update(served, **{"model_path": str(steps["b"]), field: value})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == field
    assert generate(served)["output_ids"] == generate(served)["output_ids"]  # still serving


def test_it_is_behind_the_api_key(served, steps):
    resp = httpx.post(f"{served.url}/update_weights_from_disk", json={"model_path": str(steps["b"])})
    assert resp.status_code == 401
    assert httpx.get(f"{served.url}/get_weight_version").status_code == 401


def test_a_running_request_finishes_on_the_old_weights_first(served, steps):
    """Without abort_all_requests the update waits: the request running ends as it would have, on
    the old weights, and only then does the answer come. The scheduler's line says it held the
    update while the request ran: an update that came after the request's end would wait for
    nothing, and the test would pass without testing it."""
    params = LONG
    reference = generate(served, params=params)["output_ids"]  # (the served weights: step a)
    held = f"weight update from {steps['b']} waits for the 1 requests in the engine"
    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(generate, served, PROMPT, params)
        _wait_until_running(served, running)
        seen = served.log().count(held)
        updating = pool.submit(update, served, model_path=str(steps["b"]))
        _wait_for(lambda: served.log().count(held) > seen or updating.done(), "the update's answer")
        assert served.log().count(held) > seen, "the update did not wait for the running request"
        answer = running.result(timeout=300)
        resp = updating.result(timeout=300)
    assert resp.status_code == 200, resp.text
    assert answer["output_ids"] == reference and answer["meta_info"]["finish_reason"]["type"] == "length"
    assert update(served, model_path=str(steps["a"])).status_code == 200


def test_abort_all_requests_ends_them_first(served, steps):
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(generate, served, PROMPT, ENDLESS)
        _wait_until_running(served, running)
        resp = update(served, model_path=str(steps["a"]), abort_all_requests=True)
        answer = running.result(timeout=120)
    assert resp.status_code == 200, resp.text
    assert resp.json()["message"].endswith("; 1 unfinished choices aborted")
    meta = answer["meta_info"]
    assert meta["finish_reason"] == {"type": "abort", "message": WEIGHT_UPDATE_ABORT_MESSAGE}
    assert 0 < meta["completion_tokens"] < ENDLESS["max_new_tokens"]


def test_a_request_arriving_during_the_update_runs_on_the_new_weights(served, steps, reference_b):
    """It waits in the scheduler while the update waits for the running request to end. What
    orders the two: the API server sends both down one socket, through the tokenizer, to the
    scheduler; a request sent once the scheduler says it holds the update reaches it after."""
    reference_a = generate(served, params=LONG)["output_ids"]
    with ThreadPoolExecutor(3) as pool:
        running = pool.submit(generate, served, PROMPT, ENDLESS, "endless")
        try:
            _wait_until_running(served, running)
            seen = served.log().count(UPDATE_WAITS)
            updating = pool.submit(update, served, model_path=str(steps["b"]))
            _wait_for(lambda: served.log().count(UPDATE_WAITS) > seen, "the scheduler to hold the update")
            later = pool.submit(generate, served)
            # it waits, and /get_load counts it as waiting meanwhile (a router sees the queue)
            _wait_for(lambda: later.done() or _load(served)["num_reqs"] == 2, "the later request")
            assert not later.done() and not updating.done()
            assert _load(served)["num_waiting_reqs"] == 1
        finally:  # (the running request ends here, the update follows)
            httpx.post(f"{served.url}/abort_request", json={"rid": "endless"}, headers=AUTH, timeout=30)
        assert updating.result(timeout=300).status_code == 200
        # the running request ran on the old weights until it ended (aborted), the later one on the new
        made = running.result(timeout=300)["output_ids"]
        assert 0 < len(made) < ENDLESS["max_new_tokens"]
        assert made[: len(reference_a)] == reference_a[: len(made)]
        assert later.result(timeout=300)["output_ids"] == reference_b
    assert update(served, model_path=str(steps["a"])).status_code == 200


def test_a_streamed_request_during_the_update_is_not_lost(served, steps):
    params = {**LONG, "max_new_tokens": 200}
    with httpx.stream(
        "POST",
        f"{served.url}/generate",
        json={"text": PROMPT, "sampling_params": params, "stream": True},
        headers=AUTH,
        timeout=300,
    ) as resp:
        lines = resp.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        with ThreadPoolExecutor(1) as pool:
            updating = pool.submit(update, served, model_path=str(steps["a"]))
            events = [first] + [line for line in lines if line.startswith("data: ")]
            assert updating.result(timeout=300).status_code == 200
    assert events[-1] == "data: [DONE]"
    last = json.loads(events[-2][len("data: ") :])
    assert last["meta_info"]["completion_tokens"] == 200


def _wait_for(condition: Callable[[], Any], what: str) -> None:
    deadline = time.monotonic() + 120
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _load(server) -> dict[str, int]:
    return httpx.get(f"{server.url}/get_load", headers=AUTH).json()[0]


def _wait_until_running(server, request: Future[dict[str, Any]]) -> None:
    """Until /get_load shows ``request`` running; failing at once with its own answer if it ends
    first (it failed, or ran to its end between two polls on a loaded machine)."""

    def running() -> bool:
        if request.done():  # (result() raises the request's own error)
            meta = request.result()["meta_info"]
            raise AssertionError(f"the request ended before /get_load showed it running: {meta}")
        load = _load(server)
        return load["num_reqs"] > 0 and load["num_waiting_reqs"] == 0

    _wait_for(running, "/get_load to show the request running")


def test_tensor_parallel_ranks_update_together(start_server, steps, engine_args, reference_b):
    """``--tp 2``: both ranks load their shard of the new weights; a checkpoint that does not fit
    leaves both on the old ones."""
    server = start_server(["--model", str(steps["a"]), "--tp", "2", "--api-key", API_KEY, *engine_args])
    before = generate(server)["output_ids"]
    assert update(server, model_path=str(steps["deeper"])).status_code == 400
    assert generate(server)["output_ids"] == before
    assert update(server, model_path=str(steps["b"])).status_code == 200
    assert generate(server)["output_ids"] == reference_b
