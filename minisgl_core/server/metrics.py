"""Server metrics in the Prometheus text format (written by hand: a few counters, gauges, histograms).

Counters and latency histograms are measured in the API server; gauges (running / waiting
requests, KV usage, prefix-cache hits) and the engine's counters (admitted prompt tokens, prefix
cache hits, and with speculative decoding its drafts: SPEC_COUNTERS) come from ``Engine.stats()``,
which scheduler rank 0 sends along with its outputs.
"""

from __future__ import annotations

import bisect
from collections import Counter

from minisgl_core.messages import IDLE_MS

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

#: the speculative-decoding counters (``Engine.stats()``' ``spec_*``, ``SpecStats``): (metric, stat,
#: help). The first three are vLLM's ``vllm:spec_decode_num_*`` counters under our prefix (their
#: exposition adds ``_total``, as ours): acceptance rate = accepted / draft tokens, mean acceptance
#: length = 1 + accepted / drafts; ours also count what vLLM's leave out (emitted / request steps:
#: the acceptance length ``minisgl bench`` reports, a request's verify steps without drafts too)
SPEC_COUNTERS = (
    ("minisgl_spec_decode_num_drafts_total", "spec_drafted_requests",
     "Drafts verified: a request in a verify step that carried draft tokens for it."),
    ("minisgl_spec_decode_num_draft_tokens_total", "spec_draft_tokens", "Draft tokens verified."),
    ("minisgl_spec_decode_num_accepted_tokens_total", "spec_accepted_tokens", "Draft tokens accepted."),
    ("minisgl_spec_decode_num_emitted_tokens_total", "spec_emitted_tokens",
     "Tokens verify steps gave requests (accepted drafts and one sampled token each, less a run cut by a stop)."),
    ("minisgl_spec_decode_request_steps_total", "spec_request_steps",
     "Requests' verify steps (one request in one verify step, with drafts or not)."),
    ("minisgl_spec_decode_verify_steps_total", "spec_verify_steps", "Verify steps run."),
)  # fmt: skip


class Histogram:
    def __init__(self, name: str, help_text: str, buckets: tuple[float, ...]) -> None:
        self.name = name
        self.help = help_text
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        cumulative = 0
        for bound, n in zip((*self.buckets, float("inf")), self.counts, strict=True):
            cumulative += n
            le = "+Inf" if bound == float("inf") else repr(bound)
            lines.append(f'{self.name}_bucket{{le="{le}"}} {cumulative}')
        lines += [f"{self.name}_sum {self.sum}", f"{self.name}_count {self.count}"]
        return lines


class Metrics:
    """Everything /metrics reports. Updated and rendered on the API server's event loop only."""

    def __init__(self) -> None:
        self.finished = Counter[str]()  # finish_reason -> requests
        self.rejected = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.ttft = Histogram("minisgl_time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS)
        self.itl = Histogram(
            "minisgl_inter_token_latency_seconds", "Time between two tokens of a request.", ITL_BUCKETS
        )
        self.e2e = Histogram(
            "minisgl_e2e_request_latency_seconds", "Request latency, arrival to finish.", E2E_BUCKETS
        )
        self.engine: dict[str, int] = {}

    def render(self) -> str:
        lines: list[str] = []

        def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
            lines.extend([f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"])
            lines.extend(f"{name}{labels} {value}" for labels, value in samples)

        reasons = sorted(set(self.finished) | {"stop", "length", "abort"})
        metric(
            "minisgl_requests_total",
            "counter",
            "Finished requests by finish reason (abort: the client went away, or /abort_request).",
            [(f'{{finish_reason="{r}"}}', self.finished[r]) for r in reasons],
        )
        metric(
            "minisgl_requests_rejected_total",
            "counter",
            "Requests answered with an error status (bad input, auth, failures).",
            [("", self.rejected)],
        )
        metric(
            "minisgl_prompt_tokens_total",
            "counter",
            "Prompt tokens of accepted requests.",
            [("", self.prompt_tokens)],
        )
        metric(
            "minisgl_generation_tokens_total", "counter", "Generated tokens.", [("", self.generation_tokens)]
        )
        for h in (self.ttft, self.itl, self.e2e):
            lines.extend(h.render())
        e = self.engine
        total = e.get("kv_total_tokens", 0)
        held = e.get("kv_used_tokens", 0) - e.get("cache_evictable_tokens", 0)
        prompt, cached = e.get("prompt_tokens", 0), e.get("cached_prompt_tokens", 0)
        metric(
            "minisgl_num_requests_running",
            "gauge",
            "Requests in decode or prefill.",
            [("", e.get("running", 0))],
        )
        metric(
            "minisgl_num_requests_waiting",
            "gauge",
            "Requests queued for admission.",
            [("", e.get("waiting", 0))],
        )
        metric("minisgl_kv_capacity_tokens", "gauge", "Size of the KV pool in tokens.", [("", total)])
        metric(
            "minisgl_kv_used_tokens",
            "gauge",
            "KV tokens in use (requests and prefix cache).",
            [("", e.get("kv_used_tokens", 0))],
        )
        metric(
            "minisgl_kv_request_tokens",
            "gauge",
            "KV tokens held by live requests (not reclaimable).",
            [("", held)],
        )
        metric(
            "minisgl_kv_usage_ratio",
            "gauge",
            "Share of the KV pool held by live requests.",
            [("", held / total if total else 0.0)],
        )
        metric(
            "minisgl_admitted_prompt_tokens_total",
            "counter",
            "Prompt tokens the scheduler admitted (a retracted request counts again when readmitted).",
            [("", prompt)],
        )
        metric(
            "minisgl_prefix_cache_hit_tokens_total",
            "counter",
            "Prompt tokens of admitted requests served from the prefix cache.",
            [("", cached)],
        )
        metric(
            "minisgl_prefix_cache_hit_rate",
            "gauge",
            "Share of admitted prompt tokens found in the prefix cache.",
            [("", cached / prompt if prompt else 0.0)],
        )
        metric(
            "minisgl_idle_seconds",
            "gauge",
            "How long every scheduler rank has waited for work, parked, with no request in the "
            "engine (rank 0's idle heartbeat says it once a second; 0 while the engine works).",
            [("", e.get(IDLE_MS, 0) / 1000)],
        )
        # only with --speculative-algorithm (the engine then reports them), as vLLM: a 0 would
        # read as drafts all rejected, where none are made
        for name, stat, help_text in SPEC_COUNTERS:
            if stat in e:
                metric(name, "counter", help_text, [("", e[stat])])
        return "\n".join(lines) + "\n"
