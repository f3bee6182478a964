"""Batched sampling on the model's device: penalties, temperature, top-k, top-p, min-p, seeds.

Sampling uses the exponential race, ``argmax(p / q)`` with ``q ~ Exp(1)``, which draws from ``p``
without normalising it. Without truncation (top-k/top-p/min-p) it is taken in log space,
``argmax(logits / T - log q)`` (the Gumbel-max trick): no softmax, and on CUDA two Triton
kernels in whatever dtype the model returned the logits: one sums each chunk of the vocabulary,
one a row picks a chunk by its mass and an id inside it, the noise from Philox with a fresh seed
per call (``_sampler_triton``; ``MINISGL_TRITON_SAMPLER=0``: one compiled pass per row, noise
from torch's generator). Off CUDA the same two-level race runs in torch ops
(:func:`gumbel_max_two_level`). A
seeded request draws its noise from its own generator, so it gets the same tokens whatever else
shares its batch.
"""

from __future__ import annotations

import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from minisgl_core import environment
from minisgl_core.layers.fused import fused
from minisgl_core.layers.triton_ops import triton_enabled
from minisgl_core.sampling import SamplingParams, TokenLogprob

#: uniform draws are clamped here so that neither log below sees 0 (an event of probability 1e-20)
_TINY = 1e-20
#: argmaxes over the vocabulary reduce chunks of this many ids, then the chunks' maxima: one
#: program per (row, chunk) rather than per row. On an H200, torch's argmax took 37 µs at batch 1
#: over 128k ids, and the compiled Gumbel draw (one program per row) 216 µs at batch 250; chunked
#: through Inductor, the draw got slower (it wrote its noise to memory first: 400 µs), hence the
#: hand-written kernel in ``_sampler_triton``.
_CHUNK = 2048


def _chunked_argmax(x: torch.Tensor) -> torch.Tensor:
    """``x.argmax(dim=-1)`` of a 2-D tensor (the first maximum, as torch's) in two stages."""
    rows, vocab = x.shape
    chunks = -(-vocab // _CHUNK)
    padded = F.pad(x, (0, chunks * _CHUNK - vocab), value=float("-inf")).view(rows, chunks, _CHUNK)
    best, where = padded.max(dim=-1)  # [rows, chunks]: each chunk's maximum and its first index
    chunk = best.argmax(dim=-1)  # the first chunk holding the row's maximum
    return chunk * _CHUNK + where.gather(1, chunk[:, None]).squeeze(1)


@fused
def _greedy_argmax_chunked(logits: torch.Tensor) -> torch.Tensor:
    return _chunked_argmax(logits)


def greedy_argmax(logits: torch.Tensor) -> torch.Tensor:
    """Per row ``argmax(logits)`` (the first maximum); one pass over chunks on CUDA. Elsewhere
    torch's own argmax: the chunked form pads a copy of the logits first, which on a CPU costs
    more than the argmax itself (1.2 ms of a 2-core decode step at batch 1)."""
    if not logits.is_cuda:
        return logits.argmax(dim=-1)
    return _greedy_argmax_chunked(logits)


@fused
def gumbel_argmax_compiled(
    logits: torch.Tensor, scale: torch.Tensor, noise_scale: torch.Tensor
) -> torch.Tensor:
    """Per row ``argmax(logits * scale + noise_scale * g)`` with fresh Gumbel noise ``g = -log(q)``,
    ``q ~ Exp(1)``: a draw from ``softmax(logits * scale)`` (``noise_scale`` 1) or the argmax (0)."""
    u = torch.rand(logits.shape, device=logits.device, dtype=torch.float32).clamp(min=_TINY)
    gumbel = -torch.log(-torch.log(u))
    return (logits.float() * scale[:, None] + noise_scale[:, None] * gumbel).argmax(dim=-1)


def gumbel_argmax_chunked(
    logits: torch.Tensor, scale: torch.Tensor, noise_scale: torch.Tensor, seed: int
) -> torch.Tensor:
    """:func:`gumbel_argmax_compiled` in two Triton kernels (:func:`gumbel_max_chunked`), the noise
    from Philox keyed by ``seed``."""
    return gumbel_max_chunked(logits, scale, noise_scale, seed)[1]


def gumbel_max_chunked(
    logits: torch.Tensor, scale: torch.Tensor, noise_scale: torch.Tensor, seed: int, span: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row the winning key of the Gumbel-max race over ``logits * scale`` (float32) and its
    id, drawn in two levels (``_sampler_triton``): each chunk of :data:`_CHUNK` ids summarised
    (its maximum and sum of exponentials, one program per ``span`` chunks of a row), then one
    program a row races the chunks and, inside the one it picks, the ids. ``span`` (default
    :func:`sampler_span`) does not change the draw."""
    from triton import next_power_of_2

    from minisgl_core.runner._sampler_triton import chunk_race_kernel, chunk_stats_kernel

    rows, vocab = logits.shape
    chunks = -(-vocab // _CHUNK)
    span = sampler_span(rows, chunks) if span is None else span
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    # two allocations, not views of one: Triton compiles a variant per alignment of a pointer
    chunk_max = torch.empty((rows, chunks), dtype=torch.float32, device=logits.device)
    chunk_sum = torch.empty((rows, chunks), dtype=torch.float32, device=logits.device)
    chunk_stats_kernel[(rows, -(-chunks // span))](
        logits, logits.stride(0), scale, chunk_max, chunk_sum, vocab, chunks, CHUNK=_CHUNK, SPAN=span, num_warps=8
    )  # fmt: skip
    values = torch.empty(rows, dtype=torch.float32, device=logits.device)
    indices = torch.empty(rows, dtype=torch.int64, device=logits.device)
    chunk_race_kernel[(rows,)](
        logits, logits.stride(0), scale, noise_scale, seed, vocab, chunk_max, chunk_sum, chunks, values, indices,
        TINY=_TINY, CHUNK=_CHUNK, CHUNKS_P2=next_power_of_2(chunks), FAST_LOG=not environment.triton_interpreter(),
        num_warps=4,
    )  # fmt: skip
    return values, indices


#: the spans :func:`sampler_span` picks from (each a compiled variant, all warmed up). On an H200
#: (``tools/device_sampler.py``): 1 is fastest up to 8 rows, 2-4 from 32 on (256 rows: 84 µs at 4,
#: 96 at 1, 144 for the former one-reduction-per-chunk kernel), 8 and more slower again.
SAMPLER_SPANS = (1, 2, 4)


def sampler_span(rows: int, chunks: int, programs: int = 1024) -> int:
    """Chunks per program of the Gumbel-max kernel: the widest of :data:`SAMPLER_SPANS` that
    still leaves ``programs`` programs (a few per SM), so that a wide batch pays one reduction per
    several chunks and a narrow one keeps its parallelism."""
    best = SAMPLER_SPANS[0]
    for span in SAMPLER_SPANS:
        if rows * -(-chunks // span) >= programs:
            best = span
    return best


def _gumbel_noise(
    shape: tuple[int, int], device: torch.device, generator: torch.Generator | None
) -> torch.Tensor:
    """Gumbel noise ``-log(-log(u))``, ``u ~ U[_TINY, 1)``, from ``generator`` (torch's default if None)."""
    u = torch.rand(shape, device=device, generator=generator).clamp_(min=_TINY)
    return u.log_().neg_().log_().neg_()


def gumbel_max_two_level(
    logits: torch.Tensor,
    scale: torch.Tensor,
    noise_scale: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`gumbel_max_chunked`'s two-level race in torch ops (the draw off the Triton path but
    for CUDA's own sampling): per row the winning key of ``logits * scale`` (float32) and its id.
    Each chunk of :data:`_CHUNK` ids is summed (its maximum and its sum of exponentials: one
    exponential an id), the chunks are raced by their mass, then the ids of the chunk picked, so
    noise is drawn for the chunks and one chunk a row instead of every id. Noise from
    ``generator`` (torch's default if None)."""
    rows, vocab = logits.shape
    chunks = -(-vocab // _CHUNK)
    y = logits.float() * scale[:, None]
    if chunks * _CHUNK != vocab:
        y = F.pad(y, (0, chunks * _CHUNK - vocab), value=float("-inf"))
    y = y.view(rows, chunks, _CHUNK)
    top = y.amax(dim=-1)
    nothing = top == float("-inf")  # a chunk with no id allowed: its sum is 0, its key -inf
    total = (y - top.masked_fill(nothing, 0.0)[..., None]).exp_().sum(dim=-1)
    noise = noise_scale[:, None]
    key = top + noise * (total.log() + _gumbel_noise((rows, chunks), logits.device, generator))
    win, chunk = key.masked_fill(nothing, float("-inf")).max(dim=-1)  # the first chunk holding it
    inside = y[torch.arange(rows, device=y.device), chunk]
    index = (inside + noise * _gumbel_noise((rows, _CHUNK), logits.device, generator)).argmax(dim=-1)
    return win, chunk * _CHUNK + index


#: sample_sharded's seeds (and CPU generators) are offset by this times the TP rank
_RANK_SEED_STRIDE = 1_000_003


def _race_scales(params: Sequence[SamplingParams], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of a Gumbel-max race: the logits' scale (1 / temperature) and the noise's (0 for greedy),
    in one copy. Each row starts on a 64-byte line: Triton compiles a variant per alignment of a
    pointer argument, so a second row starting right after the first (4 bytes times the batch size
    in) compiled new Gumbel-max variants in the middle of a run (a 0.6 s stall each)."""
    scales = [1.0 if p.greedy else 1.0 / p.temperature for p in params]
    noise = [0.0 if p.greedy else 1.0 for p in params]
    both = copy_to_device(aligned_rows([scales, noise], torch.float32), device)
    return both[0, : len(params)], both[1, : len(params)]


def shards_plain(requests: Sequence[SampleRequest]) -> bool:
    """Whether these rows can be sampled from each rank's slice of the vocabulary alone
    (:meth:`Sampler.sample_sharded`): no penalty, bias, ban, allowed ids, truncation, logprobs or own
    seed, which all need the whole row."""
    return all(
        r.generator is None
        and r.params.logprobs is None
        and r.params.top_k <= 0
        and r.params.top_p >= 1.0
        and r.params.min_p <= 0.0
        and not r.params.presence_penalty
        and not r.params.frequency_penalty
        and r.params.repetition_penalty == 1.0
        and not r.params.logit_bias
        and not r.banned
        and r.params.allowed_token_ids is None
        for r in requests
    )


@fused
def _mask_by_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """``logits`` with -inf at every token whose bit is 0 in its row of ``bitmask``."""
    rows, vocab = logits.shape
    shifts = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    # word w, bit b is token 32 w + b; an arithmetic shift keeps the sign bit, so bit 31 reads
    # through ``& 1`` like the others
    allowed = ((bitmask[:, :, None] >> shifts) & 1).view(rows, -1)[:, :vocab].bool()
    return torch.where(allowed, logits, float("-inf"))


def apply_token_bitmask(logits: torch.Tensor, rows: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """Forbid the tokens whose bit is 0 in ``bitmask`` (int32, ``ceil(vocab / 32)`` words per
    row) for the listed ``rows`` of ``logits`` only; in place unless every row is listed."""
    if rows.numel() == logits.shape[0]:  # every row constrained (rows are then 0..n-1 in order)
        return _mask_by_bitmask(logits, bitmask)
    logits[rows] = _mask_by_bitmask(logits[rows], bitmask)
    return logits


def _array_code(itemsize: int) -> str:
    """The signed ``array`` typecode of ``itemsize`` bytes (C's int and long differ by platform)."""
    return next(code for code in "hilq" if array.array(code).itemsize == itemsize)


#: array typecodes of the integer dtypes :func:`int_tensor` builds
_ARRAY_CODES = {torch.int64: _array_code(8), torch.int32: _array_code(4)}


def int_tensor(values: list[int], dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """A CPU tensor of Python ints, as ``torch.tensor(values, dtype=dtype)``, through an
    ``array.array``: its C loop converts an 8,192-token prefill step's lists about three times
    faster than ``torch.tensor``'s per-element one (0.24 against 0.74 ms each on the dev CPU).
    The tensor shares the array's memory, which it keeps alive. OverflowError for a value
    out of ``dtype``'s range."""
    if not values:
        return torch.empty(0, dtype=dtype)
    return torch.frombuffer(_int_array(_ARRAY_CODES[dtype], [values]), dtype=dtype)


def _int_array(code: str, rows: Iterable[Sequence[int]]) -> array.array:
    """The rows' ints back to back in one ``array.array`` of typecode ``code``. A list goes in by
    ``fromlist``, 1.6 times faster than the constructor's generic loop (0.45 against 0.75 ms for
    32,768 ints on the dev CPU); OverflowError and TypeError as the constructor's."""
    out = array.array(code)
    for row in rows:
        if type(row) is list:
            out.fromlist(row)
        else:
            out.extend(row)
    return out


def copy_to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CPU tensor on ``device`` without waiting for the device (a non-blocking copy from pageable
    memory, which the driver stages: 8-18 µs of host time for up to 64 KiB on an H200 machine,
    ``tools/device_h2d.py``). Every small host-to-device copy of a step goes through here, so a
    test can count them. A pinned staging ring measured slower (30-72 µs a copy) and was removed."""
    return host.to(device, non_blocking=True)


def _aligned(rows: list[list], dtype: torch.dtype) -> tuple[array.array | torch.Tensor, tuple[int, int]]:
    """:func:`aligned_rows`'s bytes before they become a tensor (an ``array.array`` for the
    integer dtypes, else a host tensor) and their shape."""
    per_line = 64 // dtype.itemsize  # (not a tensor made to ask: 1-3 µs of host time a block a step)
    width = -(-len(rows[0]) // per_line) * per_line
    pad = [0] * (width - len(rows[0]))
    code = _ARRAY_CODES.get(dtype)
    if code is not None:
        return _int_array(code, (part for row in rows for part in (row, pad))), (len(rows), width)
    flat: list = []
    for row in rows:
        flat += row
        flat += pad
    return torch.tensor(flat, dtype=dtype), (len(rows), width)


def aligned_rows(rows: list[list], dtype: torch.dtype) -> torch.Tensor:
    """``rows`` (of one length) as one host tensor ``[len(rows), width]`` whose rows each start on a
    64-byte line (zero padding), for one host-to-device copy of several rows: a row that kernels
    read must stay aligned as its pointer argument, whatever the batch size (Triton specialises a
    pointer on 16-byte alignment and compiles a variant per case)."""
    data, shape = _aligned(rows, dtype)
    if shape[1] == 0:
        return torch.empty(shape, dtype=dtype)
    host = torch.frombuffer(data, dtype=dtype) if isinstance(data, array.array) else data
    return host.view(shape)


def rows_to_device(
    blocks: list[tuple[list[list], torch.dtype]],
    device: torch.device,
    lap: Callable[[str], None] | None = None,
) -> list[torch.Tensor]:
    """Each ``(rows, dtype)`` block as :func:`aligned_rows` on ``device``, all through one
    host-to-device copy: the blocks' bytes back to back in one host buffer, viewed as their own
    dtypes and shapes again on the device. Every block is a whole number of 64-byte lines, so each
    of its rows stays as aligned as it would be on its own. The bytes are joined in one
    ``array.array`` (a memcpy a block on the calling thread), not by ``torch.cat``, whose CPU kernel
    hands a step's few hundred KiB to torch's thread pool. ``lap`` (the step trace's) is called with
    ``"rows"`` once each block's bytes are built, ``"pack"`` once they are joined and ``"copy"``
    once the copy is queued."""
    parts = [(_aligned(rows, dtype), dtype) for rows, dtype in blocks]
    if lap is not None:
        lap("rows")
    packed = array.array("b")
    for (data, _), _ in parts:
        packed.frombytes(memoryview(data if isinstance(data, array.array) else data.numpy()).cast("B"))
    host = torch.frombuffer(packed, dtype=torch.uint8) if packed else torch.empty(0, dtype=torch.uint8)
    if lap is not None:
        lap("pack")
    device_bytes = copy_to_device(host, device)
    if lap is not None:
        lap("copy")
    # each block a strided view of the bytes seen once as each dtype: one op a block (a slice and
    # two views were three, 1-2 µs of host time each); every block starts on a 64-byte line
    typed: dict[torch.dtype, torch.Tensor] = {}
    out, start = [], 0
    for (_, shape), dtype in parts:
        if dtype not in typed:
            typed[dtype] = device_bytes.view(dtype)
        out.append(typed[dtype].as_strided(shape, (shape[1], 1), start // dtype.itemsize))
        start += shape[0] * shape[1] * dtype.itemsize
    return out


def to_device(
    values: list | torch.Tensor, device: torch.device, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """A small host list (or host tensor) on ``device`` without waiting for the device:
    ``torch.tensor(..., device=cuda)`` or a plain ``.to(cuda)`` is a synchronous copy that blocks
    until all queued kernels finish, which would defeat overlap. A list with an explicit int64 or
    int32 ``dtype`` (token ids, slots) is built through :func:`int_tensor`; host tensors go through
    :func:`copy_to_device`."""
    if isinstance(values, list) and dtype in _ARRAY_CODES:
        return copy_to_device(int_tensor(values, dtype), device)
    host = torch.as_tensor(values, dtype=dtype)
    if host.device.type != "cpu":
        return host.to(device, non_blocking=True)
    return copy_to_device(host, device)


def vocab_ranks(logprobs: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """Each row's chosen token's rank in the vocabulary (``chosen``: ``[rows, 1]`` logprobs): the
    tokens at least as likely, itself included, as vLLM counts (1: the most likely)."""
    return (logprobs >= chosen).sum(dim=-1)


#: the logprob reported for a token the request's grammar forbids (vLLM's value)
FORBIDDEN_LOGPROB = -9999.0


@dataclass
class SampleRequest:
    """What the sampler needs of one request."""

    params: SamplingParams
    output_ids: list[int]
    generator: torch.Generator | None = None
    #: only read for repetition_penalty, which (as in Hugging Face) also counts the prompt's tokens
    prompt_ids: Sequence[int] = ()
    #: token ids that cannot be sampled now (eos and stop_token_ids before min_tokens, the bad
    #: words' last tokens: :func:`minisgl_core.token_bans.step_bans`)
    banned: Sequence[int] = ()
    #: ``params.allowed_token_ids`` already on the logits' device (the engine keeps one a request:
    #: ``Request.allowed_ids_on``); None: made from the params here, each call
    allowed_ids: torch.Tensor | None = None
    #: set from the fields above when made (the sampler asks every row of every step, where a pass
    #: a feature over hundreds of rows cost more than the answer): whether the row is drawn from
    #: the logits as they are (no logit bias, penalty, allowed ids or bans) and wants no logprobs
    plain: bool = field(init=False, repr=False, compare=False)
    #: whether the row is greedy (``params.greedy``)
    greedy: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        p = self.params
        self.greedy = p.temperature == 0.0
        self.plain = not (
            p.logit_bias
            or p.repetition_penalty != 1.0
            or p.presence_penalty
            or p.frequency_penalty
            or p.allowed_token_ids is not None
            or self.banned
            or p.logprobs is not None
        )


def apply_bans(logits: torch.Tensor, requests: Sequence[SampleRequest]) -> torch.Tensor:
    """-inf at each row's banned token ids (those inside the logits' width)."""
    rows = [i for i, r in enumerate(requests) if r.banned]
    if not rows:
        return logits
    logits = logits.to(torch.float32, copy=True)
    for i in rows:
        ids = [t for t in requests[i].banned if t < logits.shape[1]]
        if ids:
            logits[i, to_device(ids, logits.device)] = float("-inf")
    return logits


def apply_allowed_token_ids(logits: torch.Tensor, requests: Sequence[SampleRequest]) -> torch.Tensor:
    """vLLM's allowed_token_ids: -inf at every token id a row's list leaves out (admission kept
    the ids inside the vocabulary; a row of logits may be wider, its padding left out too)."""
    rows = [i for i, r in enumerate(requests) if r.params.allowed_token_ids is not None]
    if not rows:
        return logits
    masked = torch.full(logits.shape, float("-inf"), dtype=torch.float32, device=logits.device)
    others = [i for i in range(len(requests)) if requests[i].params.allowed_token_ids is None]
    if others:
        where = to_device(others, logits.device, torch.int64)
        masked[where] = logits[where].float()
    for i in rows:
        ids = requests[i].allowed_ids
        if ids is None:
            ids = to_device(list(requests[i].params.allowed_token_ids), logits.device, torch.int64)  # type: ignore[arg-type]
        masked[i, ids] = logits[i, ids].float()
    return masked


def apply_repetition_penalty(logits: torch.Tensor, requests: Sequence[SampleRequest]) -> torch.Tensor:
    """Hugging Face's repetition penalty: each token already in the prompt or the output has its
    logit divided by the penalty when positive and multiplied by it when negative."""
    rows = [i for i, r in enumerate(requests) if r.params.repetition_penalty != 1.0]
    if not rows:
        return logits
    logits = logits.to(torch.float32, copy=True)
    for i in rows:
        seen = to_device(sorted({*requests[i].prompt_ids, *requests[i].output_ids}), logits.device)
        penalty = requests[i].params.repetition_penalty
        scores = logits[i, seen]
        logits[i, seen] = torch.where(scores < 0, scores * penalty, scores / penalty)
    return logits


def apply_logit_bias(logits: torch.Tensor, requests: Sequence[SampleRequest]) -> torch.Tensor:
    """OpenAI's logit_bias: a fixed amount added to the logits of the given token ids."""
    rows = [i for i, r in enumerate(requests) if r.params.logit_bias]
    if not rows:
        return logits
    logits = logits.to(torch.float32, copy=True)
    for i in rows:
        bias = requests[i].params.logit_bias
        ids = to_device(list(bias), logits.device)
        logits[i, ids] += to_device(list(bias.values()), logits.device, torch.float32)
    return logits


class SampleResult:
    """Sampled tokens, still on the device; logprob lists are built on the host only when asked."""

    def __init__(
        self, token_ids: torch.Tensor, logprob_rows: list[int], chosen, top_ids, top_vals, ks, ranks=None
    ) -> None:
        self.token_ids = token_ids
        self._rows, self._chosen, self._top_ids, self._top_vals, self._ks = (
            logprob_rows,
            chosen,
            top_ids,
            top_vals,
            ks,
        )
        #: each logprob row's token's vocabulary rank (vLLM's count), or None
        self._ranks = ranks

    def logprobs(self, token_ids: list[int]) -> list[TokenLogprob | None]:
        out: list[TokenLogprob | None] = [None] * len(token_ids)
        if not self._rows:
            return out
        chosen = self._chosen.tolist()
        top_ids = self._top_ids.tolist() if self._top_ids is not None else None
        top_vals = self._top_vals.tolist() if self._top_vals is not None else None
        ranks = self._ranks.tolist() if self._ranks is not None else [None] * len(self._rows)
        for j, (i, k) in enumerate(zip(self._rows, self._ks)):
            top = list(zip(top_ids[j][:k], top_vals[j][:k])) if k and top_ids is not None else []
            out[i] = TokenLogprob(token_ids[i], chosen[j], top, ranks[j])
        return out


def _mix32(x: int) -> int:
    """MurmurHash3's 32-bit finaliser: a bijection of [0, 2**32) that keeps 0 at 0."""
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & 0xFFFFFFFF
    x ^= x >> 13
    x = (x * 0xC2B2AE35) & 0xFFFFFFFF
    return x ^ (x >> 16)


def fold_seed(seed: int) -> int:
    """A 64-bit seed (signed or not, as torch reads it: modulo 2**64) as one of the 32 bits the
    CPU's mt19937 keeps: the low half XOR a hash of the high half. Seeds in [0, 2**32) are
    themselves, so their draws are unchanged; the hash spreads the high half so that natural
    seeds (-1, -2**63, 2**63-1) do not land on small ones, as a plain XOR would (-1 on 0)."""
    x = seed % 2**64
    return (x & 0xFFFFFFFF) ^ _mix32(x >> 32)


class Sampler:
    def __init__(self, vocab_size: int, device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.device = device
        self.triton = triton_enabled(device, "MINISGL_TRITON_SAMPLER")
        # Philox seeds of the Triton draw: one per call, counted up from a draw of torch's RNG
        self._seed = int(torch.randint(0, 2**30, ()).item())
        #: the noise of sample_sharded off the Triton path (made on first use, keyed by rank)
        self._shard_generator: torch.Generator | None = None
        #: the last batch of rows :meth:`_kinds` was asked about (a tuple: it cannot change), and
        #: its answer
        self._kinds_memo: tuple[tuple[SampleRequest, ...], tuple[bool, bool, bool]] | None = None
        #: the same for :meth:`_race_of`: the rows, their scales on the device and the seeded rows
        self._race_memo: tuple[tuple[SampleRequest, ...], torch.Tensor, torch.Tensor, list[int]] | None = None

    def warm_up(self, dtype: torch.dtype, shard: tuple[int, int] | None = None) -> None:
        """Compile the fused sampling kernel and the grammar mask now (one and several rows), so
        that the first sampled request does not wait for them: on a cold machine that is over a
        second each. ``shard``: (columns, true ids) of this rank's slice of the logits, when it
        samples one (:meth:`sample_sharded`; Triton compiles a variant per class of sizes)."""
        if self.device.type != "cuda":
            return
        if shard is not None and self.triton:
            ones = torch.ones(2, device=self.device)
            for rows in (2, 1):
                with torch.inference_mode():
                    local = torch.zeros(rows, shard[0], dtype=dtype, device=self.device)
                for span in SAMPLER_SPANS:  # a variant each, whatever the batch's width picks
                    gumbel_max_chunked(local[:, : shard[1]], ones[:rows], ones[:rows], 1, span)
        for rows in (2, 1):
            # The compiled kernels' guards tell the model's logits (inference tensors) from tensors
            # made outside inference mode (some rows of them, a masked or penalised copy): warmed
            # up on one kind only, the others compiled inside a run (2.2-2.5 s in one step).
            with torch.inference_mode():
                model_logits = torch.zeros(rows, self.vocab_size, dtype=dtype, device=self.device)
            ones = torch.ones(rows, device=self.device)
            bitmask = torch.full(
                (rows, (self.vocab_size + 31) // 32), -1, dtype=torch.int32, device=self.device
            )
            every = torch.arange(rows, device=self.device)
            for logits in (model_logits, model_logits.clone(), model_logits.float()):
                if self.triton:
                    for span in SAMPLER_SPANS:
                        gumbel_max_chunked(logits, ones, ones, 1, span)
                else:
                    self._gumbel_argmax(logits, ones, ones)
                greedy_argmax(logits)
                apply_token_bitmask(logits, every, bitmask)  # the grammar mask on every row
            # and on some rows of a wider batch (in place, in float32)
            wider = torch.zeros(rows + 1, self.vocab_size, dtype=torch.float32, device=self.device)
            apply_token_bitmask(wider, every, bitmask)

    def make_generator(self, seed: int) -> torch.Generator:
        """A request's own generator. On the CPU its seed is first folded to 32 bits
        (:func:`fold_seed`): the CPU's mt19937 keeps only the low 32 bits, so seeds that differ
        above them (-1 and 2**32-1) drew the same tokens. CUDA's Philox keeps all 64."""
        gen = torch.Generator(device=self.device)
        gen.manual_seed(fold_seed(seed) if self.device.type == "cpu" else seed)
        return gen

    def sample(
        self,
        logits: torch.Tensor,
        requests: Sequence[SampleRequest],
        grammar_mask: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> SampleResult:
        """``logits``: [n, vocab] in float32 or the model's dtype (may be wider than the tokenizer;
        extra ids stay valid). All arithmetic is in float32.

        ``grammar_mask``: (rows, bitmask) of the constrained requests, on the device; tokens
        their grammar forbids get -inf. It is applied here, after the forward (and its CUDA-graph
        replay), so graphs stay the same for constrained and free batches. Logprobs are those of
        the model's logits with the mask applied, before penalties, bias and temperature (as
        vLLM's): a constrained request's logprobs are shares of what its grammar allows, the
        forbidden tokens' -9999.0."""
        if grammar_mask is not None:
            rows, bitmask = grammar_mask
            if rows.numel() != logits.shape[0]:  # masked in place: not in the model's output buffer
                logits = logits.float() if logits.dtype != torch.float32 else logits.clone()
            logits = apply_token_bitmask(logits, rows, bitmask)
        raw = logits
        # (one look a row when no row edits its logits or wants logprobs, as most steps: each of
        # the passes below finds no row of its own then)
        plain, greedy, truncated = self._kinds(requests)
        if not plain:
            # vLLM's order: the bias is part of the logits the penalties then scale
            logits = apply_logit_bias(logits, requests)
            logits = apply_repetition_penalty(logits, requests)
            logits = self._apply_penalties(logits, requests)
            # (the masks and bans come last, with the draw: raw logprobs never see them, as vLLM's)
            logits = apply_allowed_token_ids(logits, requests)
            logits = apply_bans(logits, requests)
        if greedy:
            token_ids = greedy_argmax(logits)
        elif truncated:
            token_ids = self._sample_truncated(logits, requests)
        else:
            token_ids = self._sample_race(logits, requests)
        if plain:  # (no row wants logprobs)
            return SampleResult(token_ids, [], None, None, None, [])
        return self._with_logprobs(raw, logits, token_ids, [r.params for r in requests])

    def _kinds(self, requests: Sequence[SampleRequest]) -> tuple[bool, bool, bool]:
        """Whether every row is plain, every row greedy, and (unless all are greedy) some row
        truncated (top_k, top_p or min_p): one pass each over the rows, remembered for a tuple of
        rows (which cannot change), as the engine hands the same one step after step while it
        samples the same requests (``Engine._sample_requests``)."""
        memo = self._kinds_memo
        if memo is not None and memo[0] is requests:
            return memo[1]
        plain = all(r.plain for r in requests)
        greedy = all(r.greedy for r in requests)
        truncated = not greedy and any(
            r.params.top_k > 0 or r.params.top_p < 1.0 or r.params.min_p > 0.0 for r in requests
        )
        if type(requests) is tuple:
            self._kinds_memo = (requests, (plain, greedy, truncated))
        return plain, greedy, truncated

    def sample_sharded(
        self, logits: torch.Tensor, requests: Sequence[SampleRequest], shard: tuple[int, int], parallel
    ) -> SampleResult:
        """Sample rows whose logits are split by vocabulary across the TP ranks (``logits``: this
        rank's ``[n, width]`` slice, ids ``start .. start + valid - 1`` of ``shard = (start,
        valid)``; columns past ``valid`` are padding). Only for :func:`shards_plain` rows.

        The Gumbel-max draw splits exactly: the largest ``logits / T + g`` over the whole
        vocabulary is the largest of each slice's largest, so each rank draws over its own ids
        with its own noise (a Philox key or generator of its own: the ranks' noises must be
        independent) and the ranks trade one (value, token) pair per row, through an all-reduce
        of a ``[tp, n, 2]`` float32 tensor in which each rank fills its own row of pairs. Every
        rank then picks the same winner (the first rank holding the maximum: torch's first
        index), so no broadcast of the tokens is needed. Token ids stay exact in float32 below
        2**24."""
        start, valid = shard
        params = [r.params for r in requests]
        device = logits.device
        local = logits[:, :valid]
        scale, noise_scale = _race_scales(params, device)
        # a key per rank (every rank counts the same seeds): the ranks' noises must differ
        rank_offset = _RANK_SEED_STRIDE * parallel.tp_rank
        if self.triton:
            key = (self._next_seed() + rank_offset) % 2**31
            values, indices = gumbel_max_chunked(local, scale, noise_scale, key)
        else:
            if self._shard_generator is None:
                self._shard_generator = torch.Generator(device=device)
                self._shard_generator.manual_seed(self._seed + rank_offset)
            values, indices = gumbel_max_two_level(local, scale, noise_scale, self._shard_generator)
        pairs = torch.zeros((parallel.tp_size, local.shape[0], 2), dtype=torch.float32, device=device)
        pairs[parallel.tp_rank, :, 0] = values
        pairs[parallel.tp_rank, :, 1] = (indices + start).float()
        parallel.all_reduce(pairs)  # each rank's pairs, on every rank (the others add zeros)
        winner = pairs[:, :, 0].argmax(dim=0, keepdim=True)
        token_ids = pairs[:, :, 1].gather(0, winner).squeeze(0).long()
        return SampleResult(token_ids, [], None, None, None, [])

    # ------------------------------------------------------------------ pieces

    def _apply_penalties(self, logits: torch.Tensor, requests: Sequence[SampleRequest]) -> torch.Tensor:
        rows = [
            i
            for i, r in enumerate(requests)
            if (r.params.presence_penalty or r.params.frequency_penalty) and r.output_ids
        ]
        if not rows:
            return logits
        logits = logits.to(torch.float32, copy=True)
        for i in rows:
            p = requests[i].params
            ids = to_device(requests[i].output_ids, logits.device)
            counts = torch.zeros(logits.shape[-1], device=logits.device).index_add_(
                0, ids, torch.ones(len(ids), device=logits.device)
            )
            logits[i] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0)
        return logits

    def _sample_race(self, logits: torch.Tensor, requests: Sequence[SampleRequest]) -> torch.Tensor:
        """Gumbel-max over the whole batch in one pass; greedy rows get no noise, seeded rows are
        redrawn with their own generators."""
        scale, noise_scale, seeded = self._race_of(requests, logits.device)
        token_ids = self._gumbel_argmax(logits, scale, noise_scale)
        for i in seeded:
            r = requests[i]
            q = self.seeded_noise(r.generator, logits.shape[-1])  # type: ignore[arg-type]
            token_ids[i] = (logits[i].float() / r.params.temperature - q.log()).argmax()
        return token_ids

    def _race_of(
        self, requests: Sequence[SampleRequest], device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """The rows' scales of a Gumbel-max race on ``device`` (:func:`_race_scales`) and the rows
        that draw their noise from their own generator, remembered for a tuple of rows as
        :meth:`_kinds` is: a batch sampled step after step copies its scales to the device once
        (the read-only tensor stays alive in the memo while the steps in flight read it)."""
        memo = self._race_memo
        if memo is not None and memo[0] is requests:
            return memo[1], memo[2], memo[3]
        scale, noise_scale = _race_scales([r.params for r in requests], device)
        seeded = [i for i, r in enumerate(requests) if r.generator is not None and not r.params.greedy]
        if type(requests) is tuple:
            self._race_memo = (requests, scale, noise_scale, seeded)
        return scale, noise_scale, seeded

    def seeded_noise(self, generator: torch.Generator, width: int) -> torch.Tensor:
        """A seeded row's Exp(1) noise over ``width`` token ids: its one draw from its request's
        generator (a non-greedy seeded row draws exactly once a sampled row)."""
        return torch.empty(width, device=self.device).exponential_(generator=generator)

    def rewind(self, generator: torch.Generator, state: torch.Tensor, draws: int, width: int) -> None:
        """Put ``generator`` where ``draws`` rows of ``width`` ids leave it from ``state``
        (``generator.get_state()`` before them): a verify step takes back the draws of the
        positions past the tokens it kept."""
        generator.set_state(state)
        for _ in range(draws):
            self.seeded_noise(generator, width)

    def _gumbel_argmax(
        self, logits: torch.Tensor, scale: torch.Tensor, noise_scale: torch.Tensor
    ) -> torch.Tensor:
        if not self.triton:
            if logits.is_cuda:  # (the Triton draw turned off: one compiled pass per row)
                return gumbel_argmax_compiled(logits, scale, noise_scale)
            return gumbel_max_two_level(logits, scale, noise_scale)[1]
        return gumbel_argmax_chunked(logits, scale, noise_scale, self._next_seed())

    def _next_seed(self) -> int:
        """The Philox seed of the next Triton draw (one per call)."""
        self._seed = (self._seed + 1) % 2**31
        return self._seed

    def _sample_truncated(self, logits: torch.Tensor, requests: Sequence[SampleRequest]) -> torch.Tensor:
        params = [r.params for r in requests]
        device = logits.device
        greedy = to_device([p.greedy for p in params], device)
        temperature = to_device([p.temperature if not p.greedy else 1.0 for p in params], device)
        probs = self._truncate(torch.softmax(logits.float() / temperature[:, None], dim=-1), params)
        noise = torch.empty_like(probs).exponential_()
        for i, r in enumerate(requests):
            if r.generator is not None:
                noise[i] = self.seeded_noise(r.generator, probs.shape[-1])
        sampled = (probs / noise).argmax(dim=-1)
        return torch.where(greedy, logits.argmax(dim=-1), sampled)

    @staticmethod
    def _truncate(probs: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
        """Zero out tokens below min-p × the best, outside top-k, then outside the top-p nucleus
        of what those leave (vLLM's and transformers' top-p: a share of the renormalised top-k,
        not of the whole distribution)."""
        device = probs.device
        vocab = probs.shape[-1]
        top_k = to_device([min(p.top_k, vocab) if p.top_k > 0 else vocab for p in params], device)
        top_p = to_device([p.top_p for p in params], device)
        min_p = to_device([p.min_p for p in params], device)
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        rank = torch.arange(vocab, device=device)[None, :]
        drop = (rank >= top_k[:, None]) | (sorted_probs < min_p[:, None] * sorted_probs[:, :1])
        kept = sorted_probs.masked_fill(drop, 0.0)  # a prefix of the sorted tokens
        # mass strictly before each token: a token is kept while that is under top_p of the kept
        # mass (the first always is; a token reached exactly at top_p is dropped, as vLLM does)
        before = kept.cumsum(dim=-1) - kept
        nucleus = (top_p[:, None] < 1.0) & (before >= top_p[:, None] * kept.sum(-1, keepdim=True))
        kept = kept.masked_fill(nucleus, 0.0)
        return torch.zeros_like(probs).scatter_(-1, order, kept)

    @staticmethod
    def _with_logprobs(
        raw_logits: torch.Tensor,
        drawn_logits: torch.Tensor,
        token_ids: torch.Tensor,
        params: Sequence[SamplingParams],
    ) -> SampleResult:
        """``raw_logits``: the model's, the grammar's mask applied; ``drawn_logits``: those the draw
        used (bias, penalties and bans applied too), for the rows whose ``scaled_logprobs`` asks for
        SGLang's logprobs (divided by the temperature here)."""
        wanted = [i for i, p in enumerate(params) if p.logprobs is not None]
        if not wanted:
            return SampleResult(token_ids, [], None, None, None, [])
        device = raw_logits.device
        rows = to_device(wanted, device)
        chosen_logits = raw_logits[rows].float()
        scaled = [j for j, i in enumerate(wanted) if params[i].scaled_logprobs]
        if scaled:
            temperatures = [params[wanted[j]].temperature or 1.0 for j in scaled]
            scale = torch.tensor(temperatures, dtype=torch.float32, device=device)[:, None]
            sources = to_device([wanted[j] for j in scaled], device)
            chosen_logits[to_device(scaled, device)] = drawn_logits[sources].float() / scale
        # a token a grammar forbids: -inf, reported as vLLM reports it (JSON has no -inf)
        logprobs = torch.log_softmax(chosen_logits, dim=-1).clamp(min=FORBIDDEN_LOGPROB)
        chosen = logprobs.gather(1, token_ids[rows][:, None]).squeeze(1)
        ranks = vocab_ranks(logprobs, chosen[:, None])
        ks = [params[i].logprobs or 0 for i in wanted]
        top_vals, top_ids = logprobs.topk(max(ks), dim=-1) if max(ks) else (None, None)
        return SampleResult(token_ids, wanted, chosen, top_ids, top_vals, ks, ranks)
