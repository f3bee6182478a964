"""Scheduling policies: which requests run in the next step.

The core computes the budgets, calls the policy, and checks its plan: a plan that breaks a
budget is cut back to fit (and logged), never trusted.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple


class RequestView(NamedTuple):
    rid: int
    #: arrival order (smaller = earlier)
    arrival: int
    prompt_len: int
    #: prompt tokens whose KV already exists (prefix-cache hit + chunks prefilled so far)
    num_computed: int
    #: tokens generated so far
    output_len: int
    max_new_tokens: int

    @property
    def remaining_prefill(self) -> int:
        return self.prompt_len - self.num_computed


class Budgets(NamedTuple):
    #: most new tokens one prefill step may process (``max_prefill_tokens``)
    prefill_tokens: int
    #: KV tokens that can still be promised (free + evictable - reserved for running requests)
    free_kv_tokens: int
    #: request rows free in the page table
    free_request_slots: int


@dataclass(frozen=True)
class SchedulerState:
    #: requests whose prompt is not fully prefilled yet; a partly prefilled one has num_computed > 0
    waiting: Sequence[RequestView]
    #: requests in decode
    running: Sequence[RequestView]
    budgets: Budgets
    #: length of the cached prefix ``rid`` would reuse if admitted now (queries the cache plugin)
    cached_prefix_len: Callable[[int], int]


class PrefillPlan(NamedTuple):
    #: (rid, number of prompt tokens to prefill this step) in the order to run them
    chunks: list[tuple[int, int]]


class DecodePlan(NamedTuple):
    rids: list[int]


class SchedulingPolicy(ABC):
    @abstractmethod
    def schedule(self, state: SchedulerState) -> PrefillPlan | DecodePlan | None:
        """Return the next step's plan, or None when nothing can run.

        Rules the core enforces: a prefill chunk's tokens count against ``prefill_tokens``;
        admitting a waiting request with ``num_computed == 0`` needs a free request slot and
        KV for ``remaining_prefill + max_new_tokens`` out of ``free_kv_tokens`` (the cached
        prefix does not count). A decode plan names running requests only.
        """
