"""Streaming under load: routes merge the events they fell behind on; the benchmark client and the
scheduler's step trace, run against a live server."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from minisgl_core.bench.serve import run_load
from minisgl_core.bench.workloads import shared_prefix
from minisgl_core.server.state import RequestGroup, TokenEvent


def event(
    index: int, token: int, text: str, reason: str | None = None, error: str | None = None
) -> TokenEvent:
    return TokenEvent(index, token, text, reason, None, [token, -0.5, []] if token >= 0 else None, error)


def collect(group: RequestGroup, waiting: list[TokenEvent], later: list[TokenEvent]) -> list:
    """The deltas of a group that already holds ``waiting`` and gets ``later`` one at a time."""

    async def run() -> list:
        for ev in waiting:
            group.queue.put_nowait(ev)
        out = []
        pending = list(later)
        async for delta in group.deltas():
            out.append(delta)
            if pending:
                group.queue.put_nowait(pending.pop(0))
        return out

    return asyncio.run(run())


def new_group(num_choices: int) -> RequestGroup:
    group = RequestGroup.__new__(RequestGroup)  # the queue is all deltas() reads
    group.queue = asyncio.Queue()
    group.num_choices = num_choices
    group.deadline = None
    return group


def test_waiting_events_merge_per_choice_and_an_error_stays_separate() -> None:
    waiting = [
        event(0, 5, "a"),
        event(1, 7, "x"),
        event(0, 6, "b"),
        event(0, 8, "c", "length"),
        event(1, -1, "", "error", error="boom"),
    ]
    deltas = collect(new_group(2), waiting, [])
    assert [(d.index, d.text, d.token_ids, d.finish_reason) for d in deltas] == [
        (0, "abc", [5, 6, 8], "length"),
        (1, "x", [7], None),
        (1, "", [], "error"),
    ]
    assert [len(d.logprobs) for d in deltas] == [3, 1, 0]
    assert deltas[2].error == "boom"


def test_a_route_that_keeps_up_gets_one_delta_per_event() -> None:
    later = [event(0, 2, "b"), event(0, 3, "c", "stop")]
    deltas = collect(new_group(1), [event(0, 1, "a")], later)
    assert [(d.text, d.token_ids) for d in deltas] == [("a", [1]), ("b", [2]), ("c", [3])]
    assert deltas[-1].finish_reason == "stop"


def test_bench_client_and_step_trace_agree_with_the_workload(
    start_server, model_dir, engine_args, auth, tmp_path
) -> None:
    steps_path, requests_path = tmp_path / "steps.jsonl", tmp_path / "requests.jsonl"
    server = start_server(
        ["--model", str(model_dir), "--api-key", auth["Authorization"].split()[1], *engine_args],
        env={"MINISGL_STEP_TRACE": str(steps_path)},
    )
    workload = shared_prefix(
        groups=2, prompts_per_group=4, prefix_len=64, question_len=8, output_len=6, vocab=500
    )
    result = asyncio.run(
        run_load(
            server.url,
            model_dir.name,
            workload,
            concurrency=4,
            api_key=auth["Authorization"].split()[1],
            trace=str(requests_path),
        )  # fmt: skip
    )
    assert result["output_tokens"] == 8 * 6
    assert 0 < result["prefix_hit_rate"] <= 1  # the second wave reuses the first wave's prefixes
    requests = [json.loads(line) for line in requests_path.read_text().splitlines()]
    assert len(requests) == 8
    for r in requests:
        assert r["sent"] <= r["first"] <= r["last"] and r["tokens"] == 6 and 1 <= r["chunks"] <= 6
        assert r["prompt_len"] == 72
    steps = [json.loads(line) for line in Path(steps_path).read_text().splitlines()]
    assert sum(s["new"] for s in steps) == 8
    prefill = [s for s in steps if s.get("kind") in ("prefill", "mixed")]
    decode = [s for s in steps if s.get("kind") == "decode"]
    # the first token of each request comes from its prefill step, the other five from decode
    # steps or from the decode rows a mixed step carries along with prompt chunks
    ridden = sum(s.get("decodes", 0) for s in prefill)
    assert sum(s["tokens"] for s in decode) + ridden == 8 * 5
    # the prompt tokens the cache did not hold (the hit rate is rounded to 4 digits)
    assert sum(s["tokens"] for s in prefill) - ridden == pytest.approx(
        8 * 72 * (1 - result["prefix_hit_rate"]), abs=0.5
    )
    assert all(s["dt"] >= 0 and s["running"] >= 0 and s["waiting"] >= 0 for s in steps)
    # one clock: the first step with a new request began after the client sent it, and soon after
    first_sent = min(r["sent"] for r in requests)
    assert first_sent < min(s["t"] for s in steps if s["new"]) < first_sent + 5


def test_bench_waits_for_the_schedulers_counters_before_the_hit_rate() -> None:
    """The hit counters reach /metrics in the scheduler's reports, which can come after the last
    response: the bench reads until the admitted prompt tokens cover the accepted ones (seen in CI:
    read at once, a run whose step trace showed 67% hits reported 22%)."""
    from minisgl_core.bench import serve

    before = {"minisgl_prompt_tokens_total": 10.0, "minisgl_admitted_prompt_tokens_total": 10.0,
              "minisgl_prefix_cache_hit_tokens_total": 0.0}  # fmt: skip
    stale = {"minisgl_prompt_tokens_total": 110.0, "minisgl_admitted_prompt_tokens_total": 60.0,
             "minisgl_prefix_cache_hit_tokens_total": 10.0}  # fmt: skip
    fresh = {
        **stale,
        "minisgl_admitted_prompt_tokens_total": 110.0,
        "minisgl_prefix_cache_hit_tokens_total": 60.0,
    }
    pages = [stale, stale, fresh]

    class Client:
        async def get(self, url, headers):
            page = pages.pop(0)

            class Response:
                text = "\n".join(f"{k} {v}" for k, v in page.items())

            return Response()

    after = asyncio.run(serve._settled_metrics(Client(), "http://x", {}, before))
    assert not pages and serve._hit_rate(before, after) == 0.6
    assert serve._hit_rate(before, stale) == 0.2  # what reading at once would have said
