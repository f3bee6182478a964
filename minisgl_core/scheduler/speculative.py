"""Speculative decoding, the scheduler's half: drafters, verify batches, accepting tokens.

A decode step with drafts becomes a *verify* step: each running request feeds its last sampled
token followed by the tokens its drafter proposed (``q_len = 1 + drafts``), and the model returns
logits at every position. The batch is a decode batch with one sequence per position, each
reading its request's page-table row up to itself: causal within the draft, on the decode
kernels and in the decode CUDA graphs. The engine samples every position (see ``engine/speculative.py``) and
:meth:`Speculator.process` keeps the longest prefix of drafts the target agreed with, plus the
token the target sampled after it: 1 to ``1 + drafts`` tokens per request per step. KV written for
rejected drafts is rolled back: ``num_computed`` goes back to the accepted length and the pages
past it return to the allocator.

A request may carry a *prediction* (OpenAI's Predicted Outputs: text the client expects most of the
output to be, tokenized): the n-gram drafter looks the output's suffix up in it too, and the
prediction's tokens the verification accepts are counted for the request's usage
(``accepted_prediction_tokens``). Drafts change the speed only: the output is the one without.

The drafter interface (:class:`Drafter`) is internal for now, not part of ``minisgl_core.api``:
a draft-model or EAGLE drafter needs more than n-gram lookup does (its own forward on the device,
its own KV or the target's hidden states, a say in CUDA-graph capture), and an API frozen around
prompt lookup alone would have to break for it. It is the shape such a plugin would implement.
"""

from __future__ import annotations

import bisect
import weakref
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

from minisgl_core.sampling import StepOutput, TokenLogprob
from minisgl_core.scheduler.kv import ceil_div
from minisgl_core.scheduler.request import REASONING, Request
from minisgl_core.scheduler.scheduler import ScheduledBatch, Scheduler

ALGORITHMS = ("ngram",)


class Drafter(ABC):
    """Proposes draft tokens for running requests; the target model verifies them in one forward.

    Drafts only change speed, never the output: a bad proposal is rejected at verification."""

    @abstractmethod
    def propose(self, requests: Sequence[Request], max_drafts: Sequence[int]) -> list[list[int]]:
        """Up to ``max_drafts[i]`` tokens expected to follow ``requests[i].all_ids()``, per request
        (an empty list: no guess). Called on the host while planning each decode step."""

    def verified(self, req: Request, draft: list[int], emitted: list[int]) -> int:
        """Told after a verify step: ``req``'s ``draft`` (as proposed, maybe cut by the budget)
        gave it the tokens ``emitted`` (the accepted drafts, then the target's own token; fewer
        after a stop). Returns how many of the request's prediction tokens
        (``Request.prediction_ids``) the step used; a drafter that reads no prediction says 0."""
        return 0


class NgramDrafter(Drafter):
    """Prompt lookup: find the longest suffix (``max_n`` down to ``min_n`` tokens) of a request's
    prompt + output that occurred earlier in it, and propose the tokens that followed its most
    recent earlier occurrence.

    Each request keeps an index of its n-grams (n-gram → where its latest occurrence ends),
    extended by the tokens added since the last step, so a lookup costs ``max_n - min_n + 1``
    dictionary reads however long the request is.

    With a prediction (``Request.prediction_ids``) the suffix is looked up in the prediction as
    well, through an index of its own (n-gram → every end of it, in order), and the longest match
    wins; at equal lengths the prediction's (it is the client's guess of the output, the prompt's
    text is a guess of what gets copied). Of a prediction's occurrences of the suffix, the first
    at or after the point the output has reached in the prediction is taken (a repeated line
    continues where the output is), found by bisection: the cost of a lookup does not grow with
    the prediction's length."""

    def __init__(self, max_n: int = 4, min_n: int = 1) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram sizes must satisfy 1 <= min <= max, got min={min_n}, max={max_n}")
        self.max_n, self.min_n = max_n, min_n
        # dropped with the request: no finish hook to call
        self._indexes: weakref.WeakKeyDictionary[Request, _NgramIndex] = weakref.WeakKeyDictionary()

    def propose(self, requests: Sequence[Request], max_drafts: Sequence[int]) -> list[list[int]]:
        out: list[list[int]] = []
        for req, k in zip(requests, max_drafts, strict=True):
            if k <= 0:
                out.append([])
                continue
            index = self._indexes.get(req)
            if index is None:
                index = self._indexes[req] = _NgramIndex(self.min_n, self.max_n)
            out.append(index.lookup(req, k))
        return out

    def verified(self, req: Request, draft: list[int], emitted: list[int]) -> int:
        index = self._indexes.get(req)
        if index is None or index.prediction is None:
            return 0
        return index.prediction.verified(draft, emitted)


class _NgramIndex:
    def __init__(self, min_n: int, max_n: int) -> None:
        self.sizes = range(max_n, min_n - 1, -1)
        #: per n-gram size: n-gram -> end (exclusive) of its latest occurrence indexed so far
        self.ends: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self.sizes}
        self.tokens: list[int] = []
        #: n-grams ending at positions up to here are indexed
        self.indexed = 0
        self.prediction: _PredictionIndex | None = None

    def lookup(self, req: Request, k: int) -> list[int]:
        if req.prediction_ids and self.prediction is None:
            self.prediction = _PredictionIndex(req.prediction_ids, self.sizes)
        tokens = self.tokens
        if len(tokens) < req.prompt_len + len(req.output_ids):
            if not tokens:
                tokens.extend(req.prompt_ids)
            tokens.extend(req.output_ids[len(tokens) - req.prompt_len :])
        length = len(tokens)
        # index every n-gram that ends before the last position: the suffix itself is the query
        for end in range(self.indexed + 1, length):
            for n in self.sizes:
                if end >= n:
                    self.ends[n][tuple(tokens[end - n : end])] = end
        self.indexed = max(self.indexed, length - 1)
        prediction = self.prediction
        if prediction is not None:
            prediction.proposed_from = None
            prediction.extend()
        for n in self.sizes:
            if length < n:
                continue
            suffix = tuple(tokens[length - n :])
            if prediction is not None:  # (at equal lengths the prediction's match wins)
                draft = prediction.lookup(suffix, k)
                if draft:
                    return draft
            if length == n:
                continue
            end = self.ends[n].get(suffix)
            if end is not None:
                return tokens[end : end + k]
        return []


#: prediction positions a lookup indexes (_PredictionIndex.extend)
_PREDICTION_CHUNK = 256


class _PredictionIndex:
    """A request's prediction: its n-grams' ends, where the output has reached in it, and which
    of its tokens verification has accepted."""

    def __init__(self, prediction: list[int], sizes: range) -> None:
        self.tokens = prediction
        #: per n-gram size: n-gram -> the ends (exclusive) of its occurrences, ascending; those
        #: at the prediction's end are left out (nothing follows them to propose)
        self.ends: dict[int, dict[tuple[int, ...], list[int]]] = {n: {} for n in sizes}
        #: ends below this are indexed (:meth:`extend`)
        self.indexed = 0
        #: the prediction's position the output has reached: after its last token accepted
        self.cursor = 0
        #: where the last proposal began in the prediction (None: the proposal was not its)
        self.proposed_from: int | None = None
        #: whether each prediction token has been accepted (each counts once)
        self.used = bytearray(len(prediction))

    def extend(self) -> None:
        """Index the next ``_PREDICTION_CHUNK`` positions' n-grams: a long prediction is indexed
        over its request's first steps (about 0.3 ms of host time a step on the dev CPU), not all
        in its first one, which every request of the step would wait for; well ahead of the
        output, which a step moves ``1 + drafts`` tokens at most."""
        tokens, start = self.tokens, self.indexed
        stop = min(start + _PREDICTION_CHUNK, len(tokens))
        if start >= stop:
            return
        for n, ends in self.ends.items():
            low = max(start, n)
            # the n-gram ending at ``end`` is tokens[end - n : end]: n shifted columns, zipped
            columns = [tokens[low - n + i : stop - n + i] for i in range(n)]
            for end, gram in zip(range(low, stop), zip(*columns)):
                found = ends.get(gram)
                if found is None:
                    ends[gram] = [end]
                else:
                    found.append(end)
        self.indexed = stop

    def lookup(self, suffix: tuple[int, ...], k: int) -> list[int]:
        ends = self.ends[len(suffix)].get(suffix)
        if not ends:
            return []
        at = bisect.bisect_left(ends, self.cursor)
        end = ends[at] if at < len(ends) else ends[-1]
        self.proposed_from = end
        return self.tokens[end : end + k]

    def verified(self, draft: list[int], emitted: list[int]) -> int:
        """The prediction tokens a verify step used (newly): the accepted drafts taken from it,
        and the target's own token after them where it is the prediction's next one too."""
        start, self.proposed_from = self.proposed_from, None
        if start is None or not draft:
            return 0
        run = 0
        tokens = self.tokens
        # a draft is the prediction's tokens from ``start``: the emitted tokens agree with it up
        # to the first rejected draft, where the target's token differs; after a whole accepted
        # draft, the target's token may go on with the prediction
        while run < len(emitted) and start + run < len(tokens) and emitted[run] == tokens[start + run]:
            run += 1
        if run == 0:
            return 0
        self.cursor = start + run
        fresh = run - sum(self.used[start : start + run])
        self.used[start : start + run] = b"\x01" * run
        return fresh


def make_drafter(algorithm: str, *, ngram_max: int = 4, ngram_min: int = 1) -> Drafter:
    if algorithm == "ngram":
        return NgramDrafter(ngram_max, ngram_min)
    raise ValueError(f"unknown speculative algorithm {algorithm!r}; choose from {', '.join(ALGORITHMS)}")


@dataclass
class SpecStats:
    """Counters of the verify steps (per request step: one request in one verify step)."""

    verify_steps: int = 0
    #: request steps that carried drafts, the drafts they carried, and how many were accepted
    drafted_requests: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    #: tokens the verify steps gave requests (accepted drafts + one sampled token per request
    #: step, less those after a stop inside the run)
    emitted_tokens: int = 0
    request_steps: int = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "spec_verify_steps": self.verify_steps,
            "spec_request_steps": self.request_steps,
            "spec_drafted_requests": self.drafted_requests,
            "spec_draft_tokens": self.draft_tokens,
            "spec_accepted_tokens": self.accepted_tokens,
            "spec_emitted_tokens": self.emitted_tokens,
        }

    @property
    def acceptance_length(self) -> float:
        """Tokens per request per verify step (1.0: no draft ever accepted)."""
        return self.emitted_tokens / self.request_steps if self.request_steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0


@dataclass
class VerifyBatch(ScheduledBatch):
    """A decode step carrying drafts: ``requests[i]`` runs ``chunk_lens[i] = 1 + len(drafts[i])``
    tokens from position ``bases[i]``; every position is sampled."""

    drafts: list[list[int]] = field(default_factory=list)
    #: each request's ``num_computed`` before the step (the position of its last sampled token)
    bases: list[int] = field(default_factory=list)


class Speculator:
    """Plans verify steps and takes their sampled tokens back (one per scheduler)."""

    def __init__(self, drafter: Drafter, num_draft_tokens: int) -> None:
        if num_draft_tokens < 1:
            raise ValueError(f"speculative_num_draft_tokens must be >= 1, got {num_draft_tokens}")
        self.drafter = drafter
        self.num_draft_tokens = num_draft_tokens
        self.stats = SpecStats()

    def build(self, scheduler: Scheduler, reqs: list[Request]) -> VerifyBatch | None:
        """A verify batch for ``reqs`` (each can already grow by one token), or None when no request
        has a draft: the step is then a plain decode (CUDA graphs, cascade)."""
        limit = scheduler.page_table.shape[1]
        budgets = [
            0
            # a constrained request's bitmask depends on the tokens before it: no drafts, but
            # while it reasons before its grammar (every token allowed)
            if r.matcher is not None and r.reasoning != REASONING
            # the step yields up to 1 + drafts tokens, all within max_tokens and the context
            else min(self.num_draft_tokens, r.remaining_output - 1, limit - 1 - r.num_computed)
            for r in reqs
        ]
        if not any(b > 0 for b in budgets):
            return None
        drafts = self.drafter.propose(reqs, budgets)
        for i, req in enumerate(reqs):
            if req.matcher is not None and drafts[i]:
                # A reasoning request's drafts stop short of its end tag: the row after the tag
                # would need the grammar's mask after it, which no matcher has yet. (The tag may
                # still be sampled, as the last token the step gives the request.)
                end = req.params.reasoning_tag_ids[1]  # type: ignore[index]
                if end in drafts[i]:
                    drafts[i] = drafts[i][: drafts[i].index(end)]
        if not any(drafts):
            return None
        kv = scheduler.kv
        first = kv.decode_slots(reqs)
        if first is None:
            return None  # the plain decode path reports it
        slots: list[int] = []
        for i, req in enumerate(reqs):
            slots.append(first[i])
            draft = drafts[i] = list(drafts[i][: budgets[i]])
            if not draft:
                continue
            req.num_computed += 1  # allocate() starts at num_computed: past the first slot
            more = kv.allocate(req, req.num_computed + len(draft))
            req.num_computed -= 1
            if more is None:  # no pages to spare for guesses: this request just decodes
                drafts[i] = []
                continue
            slots += more
        kv.decayed()
        bases = [r.num_computed for r in reqs]
        chunks = [1 + len(d) for d in drafts]
        # One decode "sequence" per verified position: position j of a request reads the request's
        # page-table row up to itself, which is causal attention within the draft, and the batch
        # is an ordinary decode batch (decode kernels, CUDA graphs). Every position's K/V is
        # stored before any is attended to, as in any attention layer.
        positions = [p for base, n in zip(bases, chunks) for p in range(base, base + n)]
        sequences = [r for r, n in zip(reqs, chunks) for _ in range(n)]
        input_ids = [t for r, d in zip(reqs, drafts) for t in (r.output_ids[-1], *d)]
        batch, _ = scheduler._forward_batch(
            False, sequences, [1] * len(positions), [p + 1 for p in positions], input_ids, positions, slots
        )
        for req, base, n in zip(reqs, bases, chunks):
            req.num_computed = base + n  # until process(): what the pages were allocated for
        return VerifyBatch(batch, reqs, chunks, list(range(len(reqs))), drafts, bases)

    def sample_rows(self, batch: VerifyBatch) -> list[tuple[Request, list[int]]]:
        """Per sampled position: its request and the output it would follow (the drafts before it
        taken as accepted), so penalties see the same history as without speculation."""
        rows: list[tuple[Request, list[int]]] = []
        for req, draft in zip(batch.requests, batch.drafts):
            rows += [(req, req.output_ids + draft[:j]) for j in range(len(draft) + 1)]
        return rows

    def process(
        self,
        scheduler: Scheduler,
        batch: VerifyBatch,
        token_ids: list[int],
        logprobs: list[TokenLogprob | None],
    ) -> list[StepOutput]:
        """Accept, per request, the drafts up to the first one that differs from the token sampled
        at its position, then that sampled token (or the one after the last draft); ``token_ids``
        holds one sampled token per position, request after request.

        Tokens are handed to :meth:`Scheduler.process` one at a time, so stop tokens, stop
        strings and max_tokens end the request at the right token."""
        stats = self.stats
        stats.verify_steps += 1
        outputs: list[StepOutput] = []
        offset = 0
        for req, draft, base in zip(batch.requests, batch.drafts, batch.bases):
            sampled = token_ids[offset : offset + len(draft) + 1]
            row_logprobs = logprobs[offset : offset + len(draft) + 1]
            offset += len(draft) + 1
            if scheduler.running.get(req.rid) is not req:
                continue
            accepted = 0
            while accepted < len(draft) and sampled[accepted] == draft[accepted]:
                accepted += 1
            stats.request_steps += 1
            if draft:
                stats.drafted_requests += 1
                stats.draft_tokens += len(draft)
                stats.accepted_tokens += accepted
            # Roll back: KV is valid up to the last accepted draft; later pages return to the pool.
            _trim_pages(scheduler, req, base + 1 + accepted)
            single = ScheduledBatch(batch.forward, [req], [1], [0])
            emitted = 0
            for j in range(accepted + 1):
                # as after a plain decode step: every token but the newest has its KV in the pool
                req.num_computed = base + 1 + j
                outputs += scheduler.process(single, [sampled[j]], [row_logprobs[j]])
                stats.emitted_tokens += 1
                emitted += 1
                if scheduler.running.get(req.rid) is not req:  # a stop: the rest of the run is dropped
                    break
            if req.prediction_ids:
                used = self.drafter.verified(req, draft, sampled[:emitted])
                if used:  # the request's usage counts them (on the step's last output)
                    outputs[-1] = outputs[-1]._replace(accepted_prediction_tokens=used)
        return outputs


def _trim_pages(scheduler: Scheduler, req: Request, kv_len: int) -> None:
    """Free ``req``'s pages past the ones holding positions ``[0, kv_len)``."""
    keep = ceil_div(max(kv_len - req.prefix_len, 0), scheduler.kv.page_size)
    if len(req.pages) > keep:
        scheduler.kv.allocator.free_pages_list(req.pages[keep:])
        del req.pages[keep:]
