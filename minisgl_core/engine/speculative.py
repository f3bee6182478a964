"""Speculative decoding, the engine's half: run a verify step and sample every position.

Verification is lossless, greedy or not. The drafts are deterministic (the n-gram drafter gives
one token, probability 1), for which the standard rule (accept draft ``d`` with probability
``p(d)``; on rejection sample from ``p`` with ``d`` removed and renormalised) is the same as:
sample ``x ~ p`` at the position as usual, accept ``d`` when ``x == d``, else emit ``x`` and stop.
``P(accept) = p(d)``, and a rejected ``x`` is ``p`` conditioned on ``x != d``, which is the
renormalised remainder. So each position goes through the ordinary sampler, with everything it
supports: temperature, top-k/top-p/min-p, penalties (each position sees the output as if the
drafts before it were accepted, as it would be without speculation, and so do min_tokens' and
bad_words' bans), logit bias, allowed_token_ids, logprobs,
and seeds: a seeded request draws once a sampled row from its own generator, so position ``j`` of
a verify step draws what decoding without drafts draws ``j`` tokens on, and the draws of the rows
past the tokens it keeps are taken back (:meth:`Sampler.rewind`). Its text is then the one without
speculation, whatever shares its steps (a prompt arriving mid-run, whose prefill steps carry the
running decodes without drafts, changed it before), whether the pool has room for its drafts or
not. Under greedy sampling this accepts a draft exactly when it is the argmax, so the output is
the one decoding without drafts gives (up to the float differences of an extend-shaped forward).

Constrained requests (grammars) get no drafts: their bitmask depends on the tokens before it.
They still run in verify batches, one position each, masked as usual.

Verify steps run without overlap scheduling: the drafter needs the newest tokens on the host
before it can plan the next step. A verify batch is a decode batch (one sequence per position),
so it replays the decode CUDA graphs like any decode step.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from minisgl_core.api import ParallelContext
from minisgl_core.engine.grammar import GrammarRunner
from minisgl_core.runner.model_runner import ModelRunner
from minisgl_core.runner.sampler import Sampler, SampleRequest, to_device
from minisgl_core.sampling import StepOutput
from minisgl_core.scheduler.scheduler import Scheduler
from minisgl_core.scheduler.speculative import Speculator, VerifyBatch
from minisgl_core.token_bans import step_bans


class VerifyRunner:
    def __init__(
        self,
        speculator: Speculator,
        *,
        runner: ModelRunner,
        sampler: Sampler,
        grammars: GrammarRunner,
        scheduler: Scheduler,
        last_tokens: torch.Tensor,
        parallel: ParallelContext,
        timer: Callable[[str, float], None] | None = None,
    ) -> None:
        self.speculator = speculator
        self.runner = runner
        self.sampler = sampler
        self.grammars = grammars
        self.scheduler = scheduler
        self.last_tokens = last_tokens
        self.parallel = parallel
        #: the engine's step-trace timer, ``timer(phase, perf_counter at the phase's start)``: a
        #: verify step's host time by phase, as a plain step's (None: no trace)
        self.timer = timer

    def _time(self, phase: str, started: float) -> None:
        if self.timer is not None:
            self.timer(phase, started)

    def run(self, batch: VerifyBatch) -> list[StepOutput]:
        """Forward the batch, sample every position, accept, and return the steps' outputs."""
        started = time.perf_counter()
        logits = self.runner.forward(batch.forward)  # one row per position
        self._time("forward", started)
        rows = self.speculator.sample_rows(batch)
        row_requests = [req for req, _ in rows]
        # A constrained request with drafts is reasoning before its grammar (Speculator.build):
        # each of its rows allows every token but end-of-text, and the matcher sees the tokens it
        # accepts after process(); any other constrained request has no drafts, so its matcher
        # masks its one row.
        drafted = {req.rid: len(req.output_ids) for req, d in zip(batch.requests, batch.drafts) if d}
        # A seeded request draws from its own generator once a sampled row: its generator's state
        # before the step, to take back the draws of the rows past the tokens it keeps
        seeded = {
            req.rid: req.generator.get_state()
            for req, d in zip(batch.requests, batch.drafts)
            if d and req.generator is not None and not req.params.greedy
        }
        pending = self.grammars.bitmask(row_requests)
        grammar_mask = None
        if pending is not None:
            started = time.perf_counter()
            grammar_mask = pending.result()
            self._time("mask_wait", started)
        started = time.perf_counter()
        result = self.sampler.sample(
            logits,
            [
                SampleRequest(
                    r.params,
                    output,
                    r.generator,
                    r.prompt_ids,
                    step_bans(r.params, output, self.scheduler.stop_checker.eos_ids),
                    r.allowed_ids_on(logits.device),
                )
                for r, output in rows
            ],  # fmt: skip
            grammar_mask,
        )
        token_ids = result.token_ids
        if self.parallel.tp_size > 1:
            # every rank accepts rank 0's tokens, whatever its own sampler drew
            torch.distributed.broadcast(token_ids, src=0, group=self.parallel.group)
        self._time("sample", started)
        started = time.perf_counter()
        tokens = token_ids.tolist()
        self._time("sync", started)
        logprobs = result.logprobs(tokens)
        constrained = [
            i for i, r in enumerate(row_requests) if r.matcher is not None and r.rid not in drafted
        ]
        if constrained:
            started = time.perf_counter()
            self.grammars.accept(
                [row_requests[i] for i in constrained],
                [tokens[i] for i in constrained],
                self.scheduler.running,
            )
            self._time("accept", started)
        started = time.perf_counter()
        outputs = self.speculator.process(self.scheduler, batch, tokens, logprobs)
        self._time("process", started)
        for req in batch.requests:
            if req.matcher is not None and req.rid in drafted:  # the tokens it accepted, in order
                taken = req.output_ids[drafted[req.rid] :]
                started = time.perf_counter()
                self.grammars.accept([req] * len(taken), taken, self.scheduler.running)
                self._time("accept", started)
        # the next plain decode step reads each request's newest token on the device
        live = [r for r in batch.requests if self.scheduler.running.get(r.rid) is r]
        for req, draft in zip(batch.requests, batch.drafts):
            state = seeded.get(req.rid)
            if state is None or self.scheduler.running.get(req.rid) is not req:
                continue
            kept = len(req.output_ids) - drafted[req.rid]
            if kept <= len(draft):  # a draft was rejected: its next draw is then the one decoding
                # without drafts makes at its next position
                self.sampler.rewind(req.generator, state, kept, logits.shape[-1])  # type: ignore[arg-type]
        if live:
            device = self.last_tokens.device
            self.last_tokens[to_device([r.row for r in live], device)] = to_device(
                [r.output_ids[-1] for r in live], device
            )
        return outputs
