"""Shortest prompt first, with aging: short requests get their first token sooner, and a request
that has waited ``max_wait_rounds`` scheduling rounds goes ahead of everything new, so a long
prompt is never postponed forever by a stream of short ones."""

from __future__ import annotations

from minisgl_core.api import DecodePlan, PrefillPlan, RequestView, SchedulerState, SchedulingPolicy


class ShortestFirstPolicy(SchedulingPolicy):
    # Read by the conformance kit: prompts longer than the prefill budget are chunked, and no
    # request waits more than about max_wait_rounds rounds.
    capabilities = frozenset({"chunked_prefill", "bounded_starvation"})

    def __init__(self, max_wait_rounds: int = 32) -> None:
        self.max_wait_rounds = max_wait_rounds
        self._round = 0
        self._first_seen: dict[int, int] = {}  # rid -> round it was first seen waiting

    def schedule(self, state: SchedulerState) -> PrefillPlan | DecodePlan | None:
        self._round += 1
        self._first_seen = {r.rid: self._first_seen.get(r.rid, self._round) for r in state.waiting}

        def order(req: RequestView) -> tuple:
            overdue = self._round - self._first_seen[req.rid] >= self.max_wait_rounds
            # partly prefilled first (they hold KV), then overdue by arrival, then shortest first
            return (req.num_computed == 0, not overdue, 0 if overdue else req.prompt_len, req.arrival)

        chunks = self._fill_budgets(state, sorted(state.waiting, key=order))
        if chunks:
            return PrefillPlan(chunks)
        if state.running:
            return DecodePlan([r.rid for r in state.running])
        return None

    @staticmethod
    def _fill_budgets(state: SchedulerState, order: list[RequestView]) -> list[tuple[int, int]]:
        """Prefill chunks in ``order`` within the budgets the core gave (it re-checks them all)."""
        budgets = state.budgets
        tokens, rows, kv = budgets.prefill_tokens, budgets.free_request_slots, budgets.free_kv_tokens
        chunks: list[tuple[int, int]] = []
        for req in order:
            if tokens <= 0:
                break
            remaining = req.remaining_prefill
            if req.num_computed == 0:  # a new request needs a row and KV for its expected future
                cached = state.cached_prefix_len(req.rid)
                # the uncached prompt plus the share of max_new_tokens the core expects to use:
                # exactly what the core itself takes when it admits the request
                need = budgets.kv_to_admit(req, cached)
                if rows == 0 or need > kv:
                    break  # wait for room rather than let later requests overtake this one
                rows, kv, remaining = rows - 1, kv - need, req.prompt_len - cached
            chunks.append((req.rid, min(remaining, tokens)))
            tokens -= chunks[-1][1]
        return chunks
