"""The two page layouts of a cascade decode step (see the backend's module docstring).

Pure index arithmetic on host lengths plus one device gather per pass
(:func:`minisgl_core.api.paged_ranges`), so it runs on any device and is tested on the CPU.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from minisgl_core.api import ForwardBatch, PageRanges, paged_ranges


class CascadeLayout(NamedTuple):
    #: prefix pass: query-row offsets of its entries (a group's rows, or one lone sequence)
    qo_indptr: list[int]
    #: prefix pass: each entry's pages (a group's shared prefix, or a lone sequence's whole KV)
    prefix: PageRanges
    #: suffix pass, one entry per sequence: a grouped sequence's pages after the prefix; a lone
    #: sequence's last page (run, then ignored: the decode kernel wants a non-empty KV)
    suffix: PageRanges
    #: per sequence: 1 when it is in a group (the suffix pass counts), else 0
    in_group: list[int]


def cascade_layout(batch: ForwardBatch, page_size: int, *, pad_entries: bool) -> CascadeLayout:
    """``pad_entries``: give the prefix pass exactly ``batch_size`` entries, the extra ones empty
    (CUDA-graph wrappers keep the batch size they were captured with)."""
    groups = {g.start: g for g in batch.shared_prefixes or ()}
    seq_lens = batch.seq_lens_cpu
    bs = len(seq_lens)
    if any(not 0 <= g.start < g.end <= bs for g in groups.values()):
        raise ValueError(f"shared prefixes fall outside the batch of {bs}: {batch.shared_prefixes}")
    entry_seqs: list[int] = []
    entry_ends: list[int] = []
    qo_indptr = [0]
    suffix_starts: list[int] = []
    in_group = [0] * bs
    i = 0
    while i < bs:
        group = groups.get(i)
        if group is not None:
            if not 0 < group.length < min(seq_lens[group.start : group.end]) or group.length % page_size:
                raise ValueError(
                    f"bad shared prefix {group} for sequence lengths {seq_lens[group.start : group.end]}"
                )
            members = group.end - group.start
            entry_seqs.append(i)
            entry_ends.append(group.length)
            qo_indptr.append(qo_indptr[-1] + members)
            suffix_starts += [group.length] * members
            in_group[group.start : group.end] = [1] * members
            i = group.end
        else:
            entry_seqs.append(i)
            entry_ends.append(seq_lens[i])
            qo_indptr.append(qo_indptr[-1] + 1)
            suffix_starts.append((seq_lens[i] - 1) // page_size * page_size)
            i += 1
    if len(groups) != sum(1 for s in entry_seqs if s in groups):
        raise ValueError(f"shared prefixes overlap: {batch.shared_prefixes}")
    if pad_entries:
        padding = bs - len(entry_seqs)
        entry_seqs += [0] * padding
        entry_ends += [0] * padding
        qo_indptr += [bs] * padding
    device = batch.page_table.device
    rows = batch.req_slots[torch.tensor(entry_seqs).to(device, non_blocking=True)]
    prefix = paged_ranges(batch.page_table, rows, [0] * len(entry_seqs), entry_ends, page_size)
    suffix = paged_ranges(batch.page_table, batch.req_slots, suffix_starts, seq_lens, page_size)
    return CascadeLayout(qo_indptr, prefix, suffix, in_group)
