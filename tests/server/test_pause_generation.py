"""SGLang's ``POST /pause_generation`` and ``POST /continue_generation``: RL trainers pause the
rollouts, update the weights, and let them go on. While paused the engine does not step, and
requests arriving are accepted and wait; ``mode`` says what becomes of the unfinished ones
(``abort`` ends them, ``retract`` gives their KV back to be computed again, ``in_place`` keeps it).

The references are the server's own answers without a pause and, for new weights, the offline
engine started on them.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import shutil
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from minisgl_core.demo.factories import make_model_dir
from minisgl_core.llm import LLM
from minisgl_core.sampling import SamplingParams
from minisgl_core.server.schemas import PAUSE_ABORT_MESSAGE

from .conftest import API_KEY, metrics

AUTH = {"Authorization": f"Bearer {API_KEY}"}
PROMPT = "The quick brown fox jumps over the lazy dog and then"
GREEDY = {"max_new_tokens": 12, "temperature": 0.0, "ignore_eos": True}
#: the served context (the models' own): room for a request that runs until the test aborts it
CONTEXT = 32768
LONG_CONTEXT = ["--max-context-len", str(CONTEXT), "--num-kv-tokens", str(2 * CONTEXT)]
#: more tokens than a request can make before a pause sent once it has made a few lands, or
#: before an abort sent once it has made a few more, on a machine however loaded (the tiny model
#: makes 300 in half a second on two idle cores; CI once saw 300 made before the pause landed, and
#: beside 3 busy loops 2,000 were made before the abort): a paused stream is aborted once it has
#: shown what the test checks (``Stream.stop_after``), and its reference is made as long as it came out
ENDLESS = {"max_new_tokens": CONTEXT - 100, "ignore_eos": True, "temperature": 0.0}


@pytest.fixture(scope="module")
def steps(tmp_path_factory) -> dict[str, Path]:
    """Two checkpoints of one model (two training steps)."""
    root = tmp_path_factory.mktemp("steps")
    return {
        "a": make_model_dir(root / "step-a", "Qwen3ForCausalLM", seed=1, max_position_embeddings=CONTEXT),
        "b": make_model_dir(root / "step-b", "Qwen3ForCausalLM", seed=2, max_position_embeddings=CONTEXT),
    }


@pytest.fixture(scope="module")
def served(start_server, steps, engine_args):
    model = steps["a"].parent / "served"
    shutil.copytree(steps["a"], model)
    return start_server(["--model", str(model), "--api-key", API_KEY, *engine_args, *LONG_CONTEXT])


@pytest.fixture(autouse=True)
def _continue_afterwards(request):
    """A failed test leaves the module's server generating, and its endless streams running (the
    next test would see their tokens): they are aborted whatever happened."""
    yield
    if "served" in request.fixturenames:
        server = request.getfixturevalue("served")
        httpx.post(f"{server.url}/continue_generation", headers=AUTH, timeout=60)
    while _OPEN_STREAMS:
        _OPEN_STREAMS.pop().end()


def post(server, path: str, body: Any = None) -> httpx.Response:
    kwargs: dict[str, Any] = {} if body is None else {"json": body}
    return httpx.post(f"{server.url}{path}", headers=AUTH, timeout=120, **kwargs)


def pause(server, mode: str | None = None) -> httpx.Response:
    return post(server, "/pause_generation", None if mode is None else {"mode": mode})


def generate(server, text: str = PROMPT, params: dict[str, Any] = GREEDY) -> dict[str, Any]:
    resp = httpx.post(
        f"{server.url}/generate", json={"text": text, "sampling_params": params}, headers=AUTH, timeout=300
    )
    assert resp.status_code == 200, resp.text
    return resp.json()


def load(server) -> dict[str, int]:
    return httpx.get(f"{server.url}/get_load", headers=AUTH).json()[0]


def generated_tokens(server) -> int:
    """The tokens the server has counted as generated (``/metrics``)."""
    return int(metrics(server.url)["minisgl_generation_tokens_total"])


def wait_for_load(server, condition) -> dict[str, int]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        now = load(server)
        if condition(now):
            return now
        time.sleep(0.02)
    raise AssertionError("/get_load never showed the state waited for")


def wait_until_running(server) -> None:
    wait_for_load(server, lambda now: now["num_reqs"] > 0 and now["num_waiting_reqs"] == 0)


class Stream:
    """A streamed /generate on a thread of its own: ``tokens`` grows as its events come."""

    def __init__(self, server, params: dict[str, Any] = ENDLESS) -> None:
        self.tokens = 0
        self.last: dict[str, Any] | None = None
        self.done = threading.Event()
        self._server = server
        self._rid = f"stream-{next(_RIDS)}"
        self._thread = threading.Thread(target=self._run, args=(params,), daemon=True)
        self._thread.start()
        _OPEN_STREAMS.append(self)

    def _run(self, params: dict[str, Any]) -> None:
        server = self._server
        body = {"text": PROMPT, "sampling_params": params, "stream": True, "rid": self._rid}
        with httpx.stream("POST", f"{server.url}/generate", json=body, headers=AUTH, timeout=300) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    self.last = json.loads(line[len("data: ") :])
                    self.tokens = self.last["meta_info"]["completion_tokens"]
        self.done.set()

    def result(self) -> dict[str, Any]:
        assert self.done.wait(300), "the stream never ended"
        assert self.last is not None
        return self.last

    def end(self) -> None:
        """Abort the request unless it has ended (a test's clean-up, whatever it left)."""
        if not self.done.is_set():
            with contextlib.suppress(httpx.HTTPError):  # (a server the test stopped has ended it)
                post(self._server, "/abort_request", {"rid": self._rid})
            self._thread.join(60)

    def stop_after(self, more: int) -> dict[str, Any]:
        """Abort the request once ``more`` tokens beyond those seen now have come; its last event."""
        target, deadline = self.tokens + more, time.monotonic() + 120
        while self.tokens < target and not self.done.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert post(self._server, "/abort_request", {"rid": self._rid}).status_code == 200
        answer = self.result()
        assert answer["meta_info"]["finish_reason"]["type"] == "abort", "it ended before the abort"
        assert len(answer["output_ids"]) >= target
        return answer


_RIDS = itertools.count()
#: the streams started by the running test, ended after it
_OPEN_STREAMS: list[Stream] = []


def reference(server, tokens: int) -> list[int]:
    """The server's greedy tokens for the prompt, unpaused."""
    return generate(server, params={**ENDLESS, "max_new_tokens": tokens})["output_ids"]


def paused_stream(server, mode: str, params: dict[str, Any] = ENDLESS) -> Stream:
    """A stream paused in ``mode`` once it has made a few tokens (fewer than ``params`` ask)."""
    stream = Stream(server, params)
    wait_for_load(server, lambda _: stream.tokens > 5)
    resp = pause(server, mode)
    assert resp.status_code == 200, resp.text
    assert not stream.done.is_set()
    return stream


@pytest.mark.parametrize("mode", ["in_place", "retract"])
def test_a_paused_request_stands_still_then_ends_as_without_the_pause(served, mode):
    """No token comes while paused; once continued the request ends with the tokens it would have
    made (``retract``: its KV was given back and computed again)."""
    short = generate(served)["output_ids"]
    before = generated_tokens(served)
    stream = Stream(served)
    wait_for_load(served, lambda _: stream.tokens > 5)
    resp = pause(served, mode)
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"message": "Generation paused successfully.", "status": "ok"}
    # the tokens the pause landed reach the client: the server counted each before it answered
    # the pause, and the stream has a chunk for each, its text held back or not
    made, deadline = generated_tokens(served) - before, time.monotonic() + 60
    while stream.tokens < made and time.monotonic() < deadline:
        time.sleep(0.01)
    seen = stream.tokens
    assert seen == made, (seen, made)
    now = load(served)
    assert (now["num_reqs"], now["num_waiting_reqs"]) == ((1, 1) if mode == "retract" else (1, 0))
    if mode == "retract":  # its KV went back: only the prefix cache holds it
        assert now["num_tokens"] == 0
    with ThreadPoolExecutor(1) as pool:
        # other traffic meanwhile: each message wakes the scheduler, which must not step
        later = pool.submit(generate, served)
        for _ in range(5):
            assert post(served, "/flush_cache").status_code == (200 if mode == "retract" else 400)
        time.sleep(1.0)
        assert stream.tokens == seen < ENDLESS["max_new_tokens"] and not stream.done.is_set()
        assert not later.done() and load(served)["num_waiting_reqs"] == (2 if mode == "retract" else 1)
        assert httpx.get(f"{served.url}/get_server_info", headers=AUTH).json()["paused"] == mode
        resp = post(served, "/continue_generation")
        assert resp.status_code == 200, resp.text
        assert resp.json() == {"message": "Generation continued successfully.", "status": "ok"}
        assert later.result(timeout=60)["output_ids"] == short
        output = stream.stop_after(20)["output_ids"]
    assert output == reference(served, len(output))
    assert httpx.get(f"{served.url}/get_server_info", headers=AUTH).json()["paused"] is None


def test_abort_the_default_ends_the_unfinished_and_holds_the_new(served):
    """No body: mode abort. The running request answers what it made; one sent while paused is
    accepted, waits (counted by /get_load), and runs after /continue_generation."""
    reference = generate(served)["output_ids"]
    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(generate, served, PROMPT, ENDLESS)
        wait_until_running(served)
        resp = pause(served)
        assert resp.status_code == 200, resp.text
        meta = running.result(timeout=60)["meta_info"]
        assert meta["finish_reason"] == {"type": "abort", "message": PAUSE_ABORT_MESSAGE}
        assert 0 < meta["completion_tokens"] < ENDLESS["max_new_tokens"]
        later = pool.submit(generate, served)
        wait_for_load(served, lambda now: now["num_waiting_reqs"] == 1)
        time.sleep(0.5)
        assert not later.done()
        assert post(served, "/continue_generation").status_code == 200
        assert later.result(timeout=60)["output_ids"] == reference


def test_a_request_held_while_paused_can_be_aborted(served):
    assert pause(served, "in_place").status_code == 200
    with ThreadPoolExecutor(1) as pool:
        body = {"text": PROMPT, "sampling_params": GREEDY, "rid": "held-1"}
        held = pool.submit(
            lambda: httpx.post(f"{served.url}/generate", json=body, headers=AUTH, timeout=60).json()
        )
        wait_for_load(served, lambda now: now["num_waiting_reqs"] == 1)
        assert post(served, "/abort_request", {"rid": "held-1"}).status_code == 200
        answer = held.result(timeout=60)
    assert answer["meta_info"]["finish_reason"]["type"] == "abort"
    assert answer["meta_info"]["completion_tokens"] == 0
    wait_for_load(served, lambda now: now["num_reqs"] == 0)
    assert post(served, "/continue_generation").status_code == 200


def test_health_generate_says_paused_and_the_cache_flushes_once_kv_is_given_back(served):
    text = PROMPT + " once more, at length, so that whole pages of it are cached"
    generate(served, text)
    assert pause(served, "in_place").status_code == 200
    resp = httpx.get(f"{served.url}/health_generate", headers=AUTH, timeout=60)
    assert resp.status_code == 503 and "paused" in resp.json()["error"]
    assert httpx.get(f"{served.url}/health", timeout=10).status_code == 200  # alive meanwhile
    # nothing holds KV: the cache empties while paused (SGLang: so in retract mode)
    assert post(served, "/flush_cache").status_code == 200
    assert post(served, "/continue_generation").status_code == 200
    assert generate(served, text)["meta_info"]["cached_tokens"] == 0
    assert httpx.get(f"{served.url}/health_generate", headers=AUTH, timeout=60).status_code == 200


def test_continue_without_a_pause_changes_nothing(served):
    before = generate(served)["output_ids"]
    assert post(served, "/continue_generation", {}).status_code == 200
    assert generate(served)["output_ids"] == before


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/pause_generation", {"mode": "sideways"}, "mode"),
        ("/pause_generation", {"mode": "abort", "surprise": 1}, "surprise"),
        ("/continue_generation", {"surprise": 1}, "surprise"),
    ],
)
def test_bad_bodies_are_a_400_naming_the_field(served, path, body, param):
    resp = post(served, path, body)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param
    assert httpx.get(f"{served.url}/get_server_info", headers=AUTH).json()["paused"] is None


def test_it_is_behind_the_api_key(served):
    for path in ("/pause_generation", "/continue_generation"):
        assert httpx.post(f"{served.url}{path}", timeout=30).status_code == 401


# ---------------------------------------------------------------- with /update_weights_from_disk


@pytest.fixture(scope="module")
def greedy_on_b(steps):
    """The offline engine on step b's weights: the greedy continuation of given token ids."""
    llm = LLM(steps["b"], device="cpu", attn="torch", max_context_len=2048, num_kv_tokens=16384)

    def run(prompt_ids: list[int], max_tokens: int) -> list[int]:
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        return list(llm.generate([prompt_ids], params, use_tqdm=False)[0].token_ids)

    yield run
    llm.close()


@pytest.fixture
def back_on_step_a(served, steps):
    """A test that updates the served weights leaves step a's behind it, failed or not."""
    yield
    post(served, "/continue_generation")
    resp = post(served, "/update_weights_from_disk", {"model_path": str(steps["a"])})
    assert resp.status_code == 200, resp.text


def test_retracted_requests_go_on_with_the_new_weights(served, steps, greedy_on_b, back_on_step_a):
    """Pause (retract), update, continue: the update does not wait for the request, which then
    continues on step b's weights from what it had made on step a's, as the offline engine on
    step b continues the same tokens."""
    prompt_ids = generate(served, params={**GREEDY, "max_new_tokens": 1})["meta_info"]["prompt_tokens"]
    stream = paused_stream(served, "retract")
    update = post(served, "/update_weights_from_disk", {"model_path": str(steps["b"])})
    assert update.status_code == 200, update.text
    assert not stream.done.is_set()
    assert post(served, "/continue_generation").status_code == 200
    output = stream.stop_after(30)["output_ids"]
    assert post(served, "/update_weights_from_disk", {"model_path": str(steps["a"])}).status_code == 200
    reference_a = reference(served, len(output))
    # where the new weights took over: the first token step a would not have made
    split = next(i for i, (got, was) in enumerate(zip(output, reference_a, strict=True)) if got != was)
    assert 5 < split < len(output)
    ids = _prompt_ids(served) + output[:split]
    assert len(ids) == prompt_ids + split
    assert output[split:] == greedy_on_b(ids, len(output) - split)


def test_in_place_requests_keep_their_kv_through_an_update_only_without_a_flush(
    served, steps, back_on_step_a
):
    """The KV they hold was computed by the old weights: emptying the cache is refused (the old
    weights serve on); with flush_cache false they continue on the new weights."""
    stream = paused_stream(served, "in_place")
    refused = post(served, "/update_weights_from_disk", {"model_path": str(steps["b"])})
    assert refused.status_code == 400
    assert "flush_cache false" in refused.json()["error"]["message"]
    taken = post(served, "/update_weights_from_disk", {"model_path": str(steps["b"]), "flush_cache": False})
    assert taken.status_code == 200, taken.text
    assert post(served, "/continue_generation").status_code == 200
    output = stream.stop_after(30)["output_ids"]
    assert post(served, "/update_weights_from_disk", {"model_path": str(steps["a"])}).status_code == 200
    reference_a = reference(served, len(output))
    assert output[:6] == reference_a[:6] and output != reference_a  # (the tail came from step b)


def test_keep_pause_leaves_generation_paused_after_the_update(served, steps, back_on_step_a):
    reference = generate(served)["output_ids"]
    resp = post(served, "/update_weights_from_disk", {"model_path": str(steps["a"]), "keep_pause": True})
    assert resp.status_code == 200, resp.text
    assert httpx.get(f"{served.url}/get_server_info", headers=AUTH).json()["paused"] == "in_place"
    with ThreadPoolExecutor(1) as pool:
        later = pool.submit(generate, served)
        wait_for_load(served, lambda now: now["num_waiting_reqs"] == 1)
        time.sleep(0.5)
        assert not later.done()
        assert post(served, "/continue_generation").status_code == 200
        assert later.result(timeout=60)["output_ids"] == reference


def _prompt_ids(server) -> list[int]:
    resp = httpx.post(f"{server.url}/tokenize", json={"prompt": PROMPT}, headers=AUTH, timeout=30)
    assert resp.status_code == 200, resp.text
    return resp.json()["tokens"]


def test_tensor_parallel_ranks_pause_together(start_server, steps, engine_args):
    """``--tp 2``: both ranks retract, wait and go on in lock-step."""
    server = start_server(
        ["--model", str(steps["a"]), "--tp", "2", "--api-key", API_KEY, *engine_args, *LONG_CONTEXT]
    )
    stream = paused_stream(server, "retract")
    time.sleep(0.5)
    assert not stream.done.is_set()
    assert post(server, "/continue_generation").status_code == 200
    output = stream.stop_after(20)["output_ids"]
    assert output == reference(server, len(output))


def test_sigterm_while_paused_lets_the_accepted_requests_finish(start_server, steps, engine_args):
    """The drain continues generation: a paused request would otherwise run out the whole
    --shutdown-timeout and end with an error."""
    server = start_server(
        ["--model", str(steps["a"]), "--api-key", API_KEY, "--shutdown-timeout", "300", *engine_args]
    )
    whole = reference(server, 2000)  # (made whole twice: not ENDLESS)
    stream = paused_stream(server, "in_place", {**ENDLESS, "max_new_tokens": 2000})
    started = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    answer = stream.result()
    assert answer["output_ids"] == whole and time.monotonic() - started < 200
    assert server.proc.wait(60) == 0
