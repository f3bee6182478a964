"""Which decode requests share a cached prompt prefix, for cascade attention.

Requests that reused a prefix from the prefix cache hold its KV slots (``Request.prefix_slots``);
two of them share a prefix exactly as far as those slots agree. :func:`group_shared_prefixes`
buckets the decode batch by the first slot, measures each bucket's common prefix, and when
reading each shared prefix once instead of once per request would save enough KV reads, orders
the batch so each group is consecutive and describes the groups as ``SharedPrefix`` runs.
"""

from __future__ import annotations

import torch

from minisgl_core.api import SharedPrefix
from minisgl_core.scheduler.request import Request

#: cascade only pays when it saves at least this many KV token reads per step (per layer it adds a
#: second kernel and a merge, a few microseconds) and at least this share of the step's KV reads
MIN_SAVED_TOKENS = 4096
MIN_SAVED_SHARE = 0.2


def common_prefix_len(a: torch.Tensor, b: torch.Tensor) -> int:
    """Length of the longest common prefix of two 1-D tensors."""
    n = min(len(a), len(b))
    differ = (a[:n] != b[:n]).nonzero()
    return int(differ[0, 0]) if len(differ) else n


def _first_slot(req: Request) -> int:
    """``int(req.prefix_slots[0])``, remembered (reading a tensor element costs a microsecond,
    and this runs for every request of every decode step)."""
    known = req.first_slot_memo
    if known is None or known[0] is not req.prefix_slots:
        known = req.first_slot_memo = (req.prefix_slots, int(req.prefix_slots[0]))
    return known[1]


def _shared_with(req: Request, leader: torch.Tensor) -> int:
    """``common_prefix_len(req.prefix_slots, leader)``, remembered on the request: both hold their
    prefix locked while they run, so the answer holds for as long as ``leader`` is that tensor."""
    known = req.shared_prefix_memo
    if known is None or known[0] is not leader:
        known = req.shared_prefix_memo = (leader, common_prefix_len(req.prefix_slots, leader))
    return known[1]


def group_shared_prefixes(
    reqs: list[Request], page_size: int
) -> tuple[list[Request], list[SharedPrefix] | None]:
    """``reqs`` reordered (groups first, consecutive) and their groups, or ``reqs`` and None when
    cascade would not pay. Each request decodes one token this step: ``num_computed + 1`` tokens
    are in its KV after it (read only for the requests of a group, and for all of them only when
    a group saves enough: most steps look at no request's length).

    A group's prefix is the common prefix of its members' reused slots, cut to whole pages and
    to less than each member's length, so every member keeps a non-empty suffix of its own."""
    buckets: dict[int, list[Request]] = {}
    for req in reqs:
        if req.prefix_len >= page_size:
            buckets.setdefault(_first_slot(req), []).append(req)
    grouped: list[Request] = []
    groups: list[SharedPrefix] = []
    saved = 0
    for members in buckets.values():
        if len(members) < 2:
            continue
        leader = members[0].prefix_slots
        length = min(_shared_with(m, leader) for m in members[1:])
        length = min(length, min(m.num_computed for m in members))  # (less than each one's length)
        length -= length % page_size
        if length <= 0:
            continue
        groups.append(SharedPrefix(len(grouped), len(grouped) + len(members), length))
        grouped += members
        saved += (len(members) - 1) * length
    if saved < MIN_SAVED_TOKENS:  # (most steps: no sum of every request's length then)
        return reqs, None
    if saved < MIN_SAVED_SHARE * sum(r.num_computed + 1 for r in reqs):
        return reqs, None
    in_groups = {id(r) for r in grouped}
    return grouped + [r for r in reqs if id(r) not in in_groups], groups
