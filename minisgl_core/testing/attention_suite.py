"""Conformance suite for attention backends: subclass it, point it at a backend, run pytest.

    from minisgl_core.testing.attention_suite import AttentionBackendSuite

    class TestMyBackend(AttentionBackendSuite):
        backend_cls = "mine"            # a registered name, "module:Class", or the class itself
        device = "cuda"
        dtype = torch.bfloat16          # atol/rtol default per dtype; set them to override

Every test builds a random paged layout (random pages, random page-table rows), fills the rest of
the pool with finite garbage and the slots of the new tokens with NaN, runs the backend and
compares with :func:`~minisgl_core.testing.paged.reference_attention` (dense K/V, float64), then
checks the new K/V landed at ``out_cache_loc`` and nothing else in the pool changed. Tests of a
capability the backend does not declare are skipped. Randomness is seeded from the test id.

Problem sizes (``gqa_ratios``, ``head_dims``, ``page_sizes``, ``max_seq_len``, ...) are class
attributes; override :meth:`make_backend` when the backend needs more than its config.
The CUDA-graph test follows the core's protocol: ``init_graph_capture(bs)``, ``prepare_capture``
on a dummy decode batch, capture ``forward``; per replay, copy the real batch's ``input_ids``,
``positions`` and ``out_cache_loc`` into the dummy's tensors, ``prepare_replay(real_batch)``, replay.
"""

from __future__ import annotations

import itertools
import math
import zlib
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar, NamedTuple

import pytest
import torch

from minisgl_core.api import AttentionBackend, AttentionConfig, ForwardBatch, KVCache, SharedPrefix
from minisgl_core.testing.paged import (
    PageTableLayout,
    make_forward_batch,
    pages_needed,
    random_page_table,
    reference_attention,
    store_prefixes,
)
from minisgl_core.testing.targets import registered, resolve

KNOWN_CAPABILITIES = frozenset(
    {
        "prefill",
        "decode",
        "cuda_graph",
        "page_size>1",
        "cascade",
        "prestored_kv",
        "kv_fp8",
        "mixed",
        "soft_cap",
        "sliding_window",
    }
)
#: the ``logits_soft_cap`` of the "soft_cap" tests: small beside the suite's scores (about 1.25
#: standard deviations), so a backend that ignores it is far off
SOFT_CAP = 1.5
#: the ``sliding_window`` of the "sliding_window" tests: shorter than most of their sequences, not
#: a multiple of a page, and on :data:`LAYER` only (layer 0 attends causally in the same steps)
WINDOW = 7
#: (atol, rtol) when the suite does not set them
DEFAULT_TOLERANCES = {torch.float32: (1e-5, 1e-5), torch.float16: (4e-3, 4e-3), torch.bfloat16: (2e-2, 2e-2)}
#: the layer single-layer tests use; layer 0 holds garbage a backend must not read
LAYER = 1


class Shape(NamedTuple):
    num_kv_heads: int
    gqa_ratio: int
    head_dim: int
    page_size: int

    def __str__(self) -> str:
        return f"kv{self.num_kv_heads}-gqa{self.gqa_ratio}-d{self.head_dim}-ps{self.page_size}"


class CapturedDecode(NamedTuple):
    """Decode forwards of ``layers`` captured in one CUDA graph, with the tensors each reads and
    writes (``q[i]``, ``k[i]``, ``v[i]`` and ``out[i]`` are layer ``layers[i]``'s)."""

    graph: torch.cuda.CUDAGraph
    layers: tuple[int, ...]
    q: list[torch.Tensor]
    k: list[torch.Tensor]
    v: list[torch.Tensor]
    out: list[torch.Tensor]


class Problem(NamedTuple):
    """One backend on a filled pool and a random layout, plus the dense K/V of every sequence."""

    backend: AttentionBackend
    config: AttentionConfig
    layout: PageTableLayout
    #: [capacity_i, kv_heads, head_dim] per sequence and layer: keys[layer][i]
    keys: list[list[torch.Tensor]]
    values: list[list[torch.Tensor]]


def registered_attention_backend(name: str) -> type[AttentionBackend]:
    """The class an installed plugin registers as attention backend ``name`` (through the core's loader)."""
    return registered("attention", name)


def import_target(target: str) -> Any:
    """The class a ``"module:Class"`` registration names (the plugins' own tests read theirs)."""
    return resolve("attention", target)


class AttentionBackendSuite:
    #: the backend: its class, "package.module:Class", or a name registered by an installed plugin
    backend_cls: ClassVar[type[AttentionBackend] | str | None] = None
    device: str = "cpu"
    dtype: torch.dtype = torch.float32
    atol: float | None = None
    rtol: float | None = None
    # Problem sizes: every shape-parametrised test runs on the product of these.
    num_kv_heads: int = 2
    gqa_ratios: Sequence[int] = (1, 2, 4, 8)
    head_dims: Sequence[int] = (64, 128)
    page_sizes: Sequence[int] = (1, 16)
    max_batch_size: int = 16
    max_seq_len: int = 80
    graph_batch_size: int = 8
    seed: int = 0

    # --- hooks a subclass may override ---

    def make_backend(self, config: AttentionConfig) -> AttentionBackend:
        return self.backend_class()(config)

    def shapes(self) -> list[Shape]:
        product = itertools.product(self.gqa_ratios, self.head_dims, self.page_sizes)
        return [Shape(self.num_kv_heads, ratio, dim, size) for ratio, dim, size in product]

    # --- plumbing ---

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "shape" in metafunc.fixturenames:
            metafunc.parametrize("shape", self.shapes(), ids=str)

    @classmethod
    def backend_class(cls) -> type[AttentionBackend]:
        target = cls.backend_cls
        if target is None:
            raise TypeError(f"{cls.__name__} must set backend_cls")
        return resolve("attention", target)

    @pytest.fixture(autouse=True)
    def _available(self) -> None:
        reason = self.backend_class().availability(torch.device(self.device))
        if reason is not None:
            pytest.skip(f"backend unavailable on {self.device}: {reason}")

    @pytest.fixture
    def generator(self, request: pytest.FixtureRequest) -> torch.Generator:
        # crc32, not hash(): the seed must not change between runs.
        return torch.Generator().manual_seed(zlib.crc32(f"{self.seed}:{request.node.name}".encode()))

    def require(self, *capabilities: str) -> None:
        missing = [c for c in capabilities if c not in self.backend_class().capabilities]
        if missing:
            pytest.skip(f"backend does not declare {', '.join(missing)}")

    def tolerances(self) -> tuple[float, float]:
        atol, rtol = DEFAULT_TOLERANCES.get(self.dtype, (1e-2, 1e-2))
        return (atol if self.atol is None else self.atol, rtol if self.rtol is None else self.rtol)

    def representative_shape(self) -> Shape:
        declared = "page_size>1" in self.backend_class().capabilities
        page_size = max(self.page_sizes) if declared else 1
        return Shape(self.num_kv_heads, max(self.gqa_ratios), max(self.head_dims), page_size)

    def randoms(self, generator: torch.Generator, count: int, low: int, high: int) -> list[int]:
        """``count`` integers in [low, high]."""
        return torch.randint(low, high + 1, (count,), generator=generator).tolist()

    def random_tensor(self, generator: torch.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(shape, generator=generator) * scale).to(device=self.device, dtype=self.dtype)

    def make_problem(
        self,
        shape: Shape,
        capacities: Sequence[int],
        generator: torch.Generator,
        kv_dtype: torch.dtype | None = None,
        soft_cap: float = 0.0,
        sliding_window: int = 0,
        window_layers: frozenset[int] = frozenset(),
    ) -> Problem:
        """A backend over a 2-layer pool full of garbage and a layout giving each sequence room
        for ``capacities[i]`` tokens; the sequences' K/V are generated, not yet stored.
        ``kv_dtype``: the pool's dtype when not the suite's (float8_e4m3fn for "kv_fp8"); the
        dense K/V are then rounded through it, so the reference sees what the pool holds.
        ``soft_cap``: the config's ``logits_soft_cap`` (API 2.6), which the reference applies too;
        ``sliding_window``/``window_layers``: the config's (API 2.7), as the reference's ``window``."""
        if shape.page_size > 1:
            self.require("page_size>1")
        page_size = shape.page_size
        num_pages = pages_needed(capacities, page_size) + 3
        max_context_len = math.ceil(max(capacities) / page_size) * page_size + page_size
        max_requests = len(capacities) + 3
        cache = KVCache(
            num_layers=2,
            num_pages=num_pages,
            page_size=page_size,
            num_kv_heads=shape.num_kv_heads,
            head_dim=shape.head_dim,
            dtype=kv_dtype or self.dtype,
            device=self.device,
        )
        # Large finite garbage: reading a slot the sequence does not own changes the output a lot.
        cache.buffer.copy_(self.random_tensor(generator, *cache.buffer.shape, scale=10.0))
        config = AttentionConfig(
            num_qo_heads=shape.num_kv_heads * shape.gqa_ratio,
            num_kv_heads=shape.num_kv_heads,
            head_dim=shape.head_dim,
            # Not 1/sqrt(head_dim), so a backend ignoring config.scale fails.
            scale=1.25 / math.sqrt(shape.head_dim),
            page_size=page_size,
            dtype=self.dtype,
            device=torch.device(self.device),
            max_requests=max_requests,
            max_context_len=max_context_len,
            kv_cache=cache,
            logits_soft_cap=soft_cap,
            sliding_window=sliding_window,
            window_layers=window_layers,
        )
        layout = random_page_table(
            capacities,
            page_size=page_size,
            num_pages=num_pages,
            max_requests=max_requests,
            max_context_len=max_context_len,
            generator=generator,
            device=self.device,
        )

        def rounded(t: torch.Tensor) -> torch.Tensor:
            return t if kv_dtype is None else t.to(kv_dtype).to(self.dtype)

        def dense() -> list[list[torch.Tensor]]:
            return [
                [
                    rounded(self.random_tensor(generator, n, shape.num_kv_heads, shape.head_dim))
                    for n in capacities
                ]
                for _ in range(cache.num_layers)
            ]

        return Problem(self.make_backend(config), config, layout, dense(), dense())

    def batch(
        self,
        problem: Problem,
        generator: torch.Generator,
        seq_lens: Sequence[int],
        extend_lens: Sequence[int],
        **kw: Any,
    ) -> ForwardBatch:
        return make_forward_batch(
            problem.layout, seq_lens, extend_lens, attn=problem.backend, generator=generator, **kw
        )

    def step_inputs(
        self,
        problem: Problem,
        generator: torch.Generator,
        batch: ForwardBatch,
        layer_id: int,
        rows: Sequence[int],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q of the new tokens, their k/v (from the dense K/V of sequences ``rows``), and NaN in
        the slots they are about to be written to, so attending before storing shows.

        As the core's decoder passes them: views of one ``[tokens, q + 2 * kv heads, head_dim]``
        tensor (see ``minisgl_core.layers.fused.qkv_norm_rope``), so q is strided and k/v are adjacent."""
        config = problem.config
        pieces = list(zip(rows, batch.prefix_lens_cpu, batch.seq_lens_cpu, strict=True))
        k = torch.cat([problem.keys[layer_id][r][p:s] for r, p, s in pieces])
        v = torch.cat([problem.values[layer_id][r][p:s] for r, p, s in pieces])
        self.poison_slots(problem, layer_id, batch.out_cache_loc)
        q = self.random_tensor(generator, batch.num_tokens, config.num_qo_heads, config.head_dim)
        qkv = torch.cat((q, k.to(q.dtype), v.to(q.dtype)), dim=1)
        q, k, v = qkv.split((config.num_qo_heads, config.num_kv_heads, config.num_kv_heads), dim=1)
        return q, k, v

    def poison_slots(self, problem: Problem, layer_id: int, slots: torch.Tensor) -> None:
        """NaN in K and V of ``slots``: any read of them before a write shows in the output."""
        config = problem.config
        pool = config.kv_cache.buffer[layer_id].view(2, -1, config.num_kv_heads, config.head_dim)
        pool[:, slots] = float("nan")

    def check_step(
        self,
        problem: Problem,
        batch: ForwardBatch,
        layer_id: int,
        rows: Sequence[int],
        inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        output: torch.Tensor,
        pool_before: torch.Tensor,
    ) -> None:
        """The output matches the dense reference; the pool changed exactly at ``out_cache_loc``."""
        q, k, v = inputs
        assert output.shape == q.shape, f"output shape {tuple(output.shape)}, expected {tuple(q.shape)}"
        assert output.dtype == q.dtype, f"output dtype {output.dtype}, expected {q.dtype}"
        assert output.device == q.device, f"output on {output.device}, expected {q.device}"
        keys = [problem.keys[layer_id][r][:s] for r, s in zip(rows, batch.seq_lens_cpu, strict=True)]
        values = [problem.values[layer_id][r][:s] for r, s in zip(rows, batch.seq_lens_cpu, strict=True)]
        config = problem.config
        expected = reference_attention(
            q,
            keys,
            values,
            batch.extend_lens_cpu,
            config.scale,
            config.logits_soft_cap,
            config.window_of(layer_id),
        )
        atol, rtol = self.tolerances()
        torch.testing.assert_close(output.detach().cpu().double(), expected, atol=atol, rtol=rtol)

        flat = pool_before[layer_id].view(2, -1, config.num_kv_heads, config.head_dim)
        flat[0, batch.out_cache_loc] = k.to(config.kv_cache.dtype)
        flat[1, batch.out_cache_loc] = v.to(config.kv_cache.dtype)
        # Bitwise, NaN equal to NaN (assert_close on the whole pool is several times slower).
        pool = config.kv_cache.buffer
        if pool.element_size() == 1:  # float8: compare the bytes (NaN is one bit pattern)
            same = pool.view(torch.uint8) == pool_before.view(torch.uint8)
        else:
            same = (pool == pool_before) | (pool.isnan() & pool_before.isnan())
        if not bool(same.all()):
            bad = (~same).view(pool.shape[0], 2, config.kv_cache.num_slots, -1).any(-1).nonzero().tolist()
            raise AssertionError(
                f"KV pool should change exactly at out_cache_loc; {len(bad)} (layer, k/v, slot) differ, "
                f"first: {bad[:4]}; out_cache_loc: {batch.out_cache_loc.tolist()[:16]}"
            )

    def run_step(
        self,
        problem: Problem,
        generator: torch.Generator,
        batch: ForwardBatch,
        layer_id: int = LAYER,
        rows: Sequence[int] | None = None,
        prepare: bool = True,
        prestore: bool = False,
    ) -> None:
        """Prepare, run one layer's forward on ``batch`` and check it (``rows``: which sequences of
        the problem the batch holds, default the first ``bs``). ``prestore``: write the new
        tokens' k/v to the pool first and call ``attend``, as the core's decoder does with
        backends declaring "prestored_kv"."""
        rows = list(range(batch.batch_size)) if rows is None else list(rows)
        if prepare:
            problem.backend.prepare_metadata(batch)
        inputs = self.step_inputs(problem, generator, batch, layer_id, rows)
        pool_before = problem.config.kv_cache.buffer.clone()
        q, k, v = inputs
        if prestore:
            problem.config.kv_cache.store(layer_id, batch.out_cache_loc, k, v)
            output = problem.backend.attend(q, layer_id, batch)
        else:
            output = problem.backend.forward(q, k, v, layer_id, batch)
        self.check_step(problem, batch, layer_id, rows, inputs, output, pool_before)

    def single_step(
        self,
        shape: Shape,
        generator: torch.Generator,
        seq_lens: list[int],
        extend_lens: list[int],
        is_prefill: bool | None = None,
    ) -> None:
        """Run one step whose cached prefixes are already in the pool."""
        problem = self.make_problem(shape, seq_lens, generator)
        if is_prefill is None:
            is_prefill = any(e > 1 for e in extend_lens)
        batch = self.batch(problem, generator, seq_lens, extend_lens, is_prefill=is_prefill)
        store_prefixes(problem.config.kv_cache, LAYER, batch, problem.keys[LAYER], problem.values[LAYER])
        self.run_step(problem, generator, batch)

    # --- the tests ---

    def test_capabilities_are_known(self) -> None:
        cls = self.backend_class()
        assert issubclass(cls, AttentionBackend), f"{cls} does not subclass AttentionBackend"
        unknown = set(cls.capabilities) - KNOWN_CAPABILITIES
        assert not unknown, f"unknown capabilities {sorted(unknown)}; known: {sorted(KNOWN_CAPABILITIES)}"

    def test_prefill(self, shape: Shape, generator: torch.Generator) -> None:
        self.require("prefill")
        bs = min(4, self.max_batch_size)
        seq_lens = [self.max_seq_len] + self.randoms(generator, bs - 1, 1, self.max_seq_len)
        self.single_step(shape, generator, seq_lens, seq_lens)

    def test_extend_with_cached_prefix(self, shape: Shape, generator: torch.Generator) -> None:
        """Chunked prefill: the new tokens attend to a prefix written by earlier steps."""
        self.require("prefill")
        bs = min(6, self.max_batch_size)
        seq_lens = [self.max_seq_len] + self.randoms(generator, bs - 1, 2, self.max_seq_len)
        prefixes = [min(shape.page_size, seq_lens[0] - 1)]  # a prefix ending on a page boundary
        prefixes += [self.randoms(generator, 1, 1, s - 1)[0] for s in seq_lens[1:]]
        self.single_step(shape, generator, seq_lens, [s - p for s, p in zip(seq_lens, prefixes, strict=True)])

    def test_decode(self, shape: Shape, generator: torch.Generator) -> None:
        self.require("decode")
        page = shape.page_size
        edges = [1, page, page + 1, 2 * page - 1, self.max_seq_len]
        seq_lens = [min(n, self.max_seq_len) for n in edges][: self.max_batch_size]
        seq_lens += self.randoms(generator, self.max_batch_size - len(seq_lens), 1, self.max_seq_len)
        problem = self.make_problem(shape, seq_lens, generator)
        batch = self.batch(problem, generator, seq_lens, [1] * len(seq_lens), is_prefill=False)
        store_prefixes(problem.config.kv_cache, LAYER, batch, problem.keys[LAYER], problem.values[LAYER])
        self.run_step(problem, generator, batch)

    def test_mixed_batch(self, shape: Shape, generator: torch.Generator) -> None:
        """One prefill batch mixing fresh prompts, chunk continuations and single new tokens."""
        self.require("prefill")
        longest = self.max_seq_len
        cases = [(longest, longest), (1, 1), (longest, 1), (longest // 2 + 1, longest // 4 + 1), (3, 2)]
        cases = cases[: self.max_batch_size]
        order = torch.randperm(len(cases), generator=generator).tolist()
        self.single_step(shape, generator, [cases[i][0] for i in order], [cases[i][1] for i in order])

    def test_mixed_step(self, shape: Shape, generator: torch.Generator) -> None:
        """(API 2.0, "mixed") The core's mixed step: decode rows first (one new token after KV of
        page-edge and random lengths), then prompt chunks, all in one prefill batch."""
        self.require("prefill", "mixed")
        page, longest = shape.page_size, self.max_seq_len
        decodes = [min(n, longest) for n in (1, page, page + 1, 2 * page - 1, longest)]
        room = max(self.max_batch_size - 2, 1)
        decodes = decodes[:room] + self.randoms(generator, max(room - len(decodes), 0), 1, longest)
        seq_lens = decodes + [longest, longest // 2 + 1][: self.max_batch_size - len(decodes)]
        extend_lens = [1] * len(decodes) + [longest // 3 + 1, longest // 2 + 1][
            : len(seq_lens) - len(decodes)
        ]
        self.single_step(shape, generator, seq_lens, extend_lens, is_prefill=True)

    def test_prestored_kv(self, generator: torch.Generator) -> None:
        """(API 1.5) With "prestored_kv": k and v already in the pool, ``attend(q, layer_id, batch)``
        attends over them and writes nothing; a prefill step then decode steps (a decode-only
        backend: the prompts stored by the suite, then the decode steps)."""
        self.require("decode", "prestored_kv")
        prompts, decode_steps = [self.max_seq_len - 2, 5, 1], 2
        capacities = [p + decode_steps for p in prompts]
        problem = self.make_problem(self.representative_shape(), capacities, generator)
        for batch in self.prompt_then_decode_steps(problem, generator, prompts, decode_steps):
            self.run_step(problem, generator, batch, prestore=True)

    def prompt_then_decode_steps(
        self, problem: Problem, generator: torch.Generator, prompts: list[int], decode_steps: int
    ) -> Iterator[ForwardBatch]:
        """The batches of a prefill step over ``prompts`` then ``decode_steps`` decode steps. For a
        backend without "prefill" the prompts' K/V are stored by the suite before the first decode
        step instead (later steps read what the backend stored)."""
        decode_only = "prefill" not in self.backend_class().capabilities
        if not decode_only:
            yield self.batch(problem, generator, prompts, prompts, is_prefill=True)
        for i in range(1, decode_steps + 1):
            batch = self.batch(
                problem, generator, [p + i for p in prompts], [1] * len(prompts), is_prefill=False
            )
            if decode_only and i == 1:
                store_prefixes(
                    problem.config.kv_cache, LAYER, batch, problem.keys[LAYER], problem.values[LAYER]
                )
            yield batch

    def test_layers_share_metadata(self, generator: torch.Generator) -> None:
        """prepare_metadata runs once per step; every layer's forward reuses it on its own KV."""
        self.require("prefill")
        seq_lens, extend_lens = [self.max_seq_len, 9, 30], [self.max_seq_len - 5, 9, 1]
        problem = self.make_problem(self.representative_shape(), seq_lens, generator)
        batch = self.batch(problem, generator, seq_lens, extend_lens)
        problem.backend.prepare_metadata(batch)
        for layer_id in (0, 1):
            store_prefixes(
                problem.config.kv_cache, layer_id, batch, problem.keys[layer_id], problem.values[layer_id]
            )
            self.run_step(problem, generator, batch, layer_id=layer_id, prepare=False)

    def test_steps_on_shared_pages(self, generator: torch.Generator) -> None:
        """Two prefill chunks then decode steps on one layout: each step reads only what earlier
        steps of the backend stored (the pool starts with NaN in every sequence slot)."""
        self.require("prefill", "decode")
        prompts, decode_steps = [self.max_seq_len - 3, 2, 17], 3
        capacities = [p + decode_steps for p in prompts]
        problem = self.make_problem(self.representative_shape(), capacities, generator)
        full = self.batch(problem, generator, capacities, capacities)
        self.poison_slots(problem, LAYER, full.out_cache_loc)
        first_chunk = [p // 2 for p in prompts]
        steps = [
            (first_chunk, first_chunk),
            (prompts, [p - c for p, c in zip(prompts, first_chunk, strict=True)]),
        ]
        steps += [([p + i for p in prompts], [1] * len(prompts)) for i in range(1, decode_steps + 1)]
        for seq_lens, extend_lens in steps:
            is_prefill = any(e > 1 for e in extend_lens)
            self.run_step(
                problem,
                generator,
                self.batch(problem, generator, seq_lens, extend_lens, is_prefill=is_prefill),
            )

    def test_fp8_kv_cache(self, generator: torch.Generator) -> None:
        """(API 2.0) With "kv_fp8": over a float8_e4m3fn pool, the backend stores the new k/v cast
        to float8 and attends over the dequantized pool; a prefill step then decode steps,
        compared with the reference on the same float8-rounded K/V (a decode-only backend: the
        prompts stored by the suite, then the decode steps)."""
        self.require("decode", "kv_fp8")
        prompts, decode_steps = [self.max_seq_len - 3, 2, 17], 2
        capacities = [p + decode_steps for p in prompts]
        problem = self.make_problem(
            self.representative_shape(), capacities, generator, kv_dtype=torch.float8_e4m3fn
        )
        assert problem.config.kv_cache.buffer.dtype == torch.float8_e4m3fn
        for batch in self.prompt_then_decode_steps(problem, generator, prompts, decode_steps):
            self.run_step(problem, generator, batch)

    def test_soft_cap(self, generator: torch.Generator) -> None:
        """(API 2.6) With "soft_cap": ``config.logits_soft_cap`` caps the scaled scores
        (``cap * tanh(scores / cap)``) before the softmax, in a prefill step, decode steps and an
        extend over a cached prefix; the reference caps them too."""
        self.require("soft_cap")
        shape = self.representative_shape()
        prompts, decode_steps = [self.max_seq_len - 3, 2, 17], 2
        problem = self.make_problem(shape, [p + decode_steps for p in prompts], generator, soft_cap=SOFT_CAP)
        for batch in self.prompt_then_decode_steps(problem, generator, prompts, decode_steps):
            self.run_step(problem, generator, batch)
        if "prefill" in self.backend_class().capabilities:
            seq_lens, extend_lens = [40, 9], [13, 9]
            problem = self.make_problem(shape, seq_lens, generator, soft_cap=SOFT_CAP)
            batch = self.batch(problem, generator, seq_lens, extend_lens, is_prefill=True)
            store_prefixes(problem.config.kv_cache, LAYER, batch, problem.keys[LAYER], problem.values[LAYER])
            self.run_step(problem, generator, batch)

    def test_sliding_window(self, generator: torch.Generator) -> None:
        """(API 2.7) With "sliding_window": in the layers of ``config.window_layers`` a query sees
        only the last ``config.sliding_window`` positions up to its own, the other layers every
        position, in the same steps: a prefill step then decode steps (a lone decode row too),
        an extend over a cached prefix longer than the window, and a mixed batch."""
        self.require("sliding_window")
        shape = self.representative_shape()
        window = {"sliding_window": WINDOW, "window_layers": frozenset({LAYER})}
        for prompts in ([self.max_seq_len - 3, 2, 17, WINDOW, WINDOW + 1], [WINDOW + 5]):
            prompts = prompts[: self.max_batch_size]
            decode_steps = 2
            problem = self.make_problem(shape, [p + decode_steps for p in prompts], generator, **window)
            for step, batch in enumerate(
                self.prompt_then_decode_steps(problem, generator, prompts, decode_steps)
            ):
                if step == 0 and batch.extend_lens_cpu == [1] * len(prompts):  # (decode only: the
                    # suite stored the prompts of LAYER, not of layer 0)
                    store_prefixes(problem.config.kv_cache, 0, batch, problem.keys[0], problem.values[0])
                problem.backend.prepare_metadata(batch)
                for layer_id in (0, LAYER):
                    self.run_step(problem, generator, batch, layer_id=layer_id, prepare=False)
        if "prefill" not in self.backend_class().capabilities:
            return
        longest = self.max_seq_len
        cases = [(40, 13), (9, 9), (longest, 1), (WINDOW + 2, 1), (longest, longest // 2), (WINDOW * 3, 2)]
        cases = cases[: self.max_batch_size]
        seq_lens, extend_lens = [s for s, _ in cases], [e for _, e in cases]
        problem = self.make_problem(shape, seq_lens, generator, **window)
        batch = self.batch(problem, generator, seq_lens, extend_lens, is_prefill=True)
        problem.backend.prepare_metadata(batch)
        for layer_id in (0, LAYER):
            store_prefixes(
                problem.config.kv_cache, layer_id, batch, problem.keys[layer_id], problem.values[layer_id]
            )
            self.run_step(problem, generator, batch, layer_id=layer_id, prepare=False)

    def test_soft_cap_cuda_graph_decode(self, generator: torch.Generator) -> None:
        """(API 2.6) A decode step with ``logits_soft_cap`` captured in a CUDA graph and replayed."""
        self.require("decode", "cuda_graph", "soft_cap")
        if torch.device(self.device).type != "cuda":
            pytest.skip("CUDA graphs need a CUDA device")
        n = self.graph_batch_size
        seq_lens = self.randoms(generator, n, 1, self.max_seq_len)
        problem = self.make_problem(
            self.representative_shape(), seq_lens + [1] * n, generator, soft_cap=SOFT_CAP
        )
        dummy = self.batch(
            problem, generator, [1] * n, [1] * n, rows=range(n, 2 * n), is_prefill=False, captured=True
        )
        captured = self.capture_decode(problem, dummy)
        rows = list(range(n))
        batch = self.batch(problem, generator, seq_lens, [1] * n, rows=rows, is_prefill=False, captured=True)
        self.replay_and_check(problem, generator, captured, dummy, batch, rows)

    def test_sliding_window_cuda_graph_decode(self, generator: torch.Generator) -> None:
        """(API 2.7) A decode step of two layers, one windowed and one not, captured in one CUDA
        graph and replayed for two batches, each with a cascade graph's ``shared_prefixes=[]``
        too where the backend declares "cascade" (a windowed model may run plain decode there)."""
        self.require("decode", "cuda_graph", "sliding_window")
        if torch.device(self.device).type != "cuda":
            pytest.skip("CUDA graphs need a CUDA device")
        n = self.graph_batch_size
        window = {"sliding_window": WINDOW, "window_layers": frozenset({LAYER})}
        real_lens = [self.randoms(generator, n, WINDOW, self.max_seq_len) for _ in range(2)]
        cascade = "cascade" in self.backend_class().capabilities
        problem = self.make_problem(
            self.representative_shape(), real_lens[0] + real_lens[1] + [1] * n, generator, **window
        )
        dummy = self.batch(
            problem, generator, [1] * n, [1] * n, rows=range(2 * n, 3 * n), is_prefill=False, captured=True
        )
        if cascade:
            dummy.shared_prefixes = []
        captured = self.capture_decode(problem, dummy, layers=(0, LAYER))
        for part, seq_lens in enumerate(real_lens):
            rows = list(range(part * n, (part + 1) * n))
            batch = self.batch(
                problem, generator, seq_lens, [1] * n, rows=rows, is_prefill=False, captured=True
            )
            if cascade:
                batch.shared_prefixes = []
            self.replay_and_check(problem, generator, captured, dummy, batch, rows)

    def capture_decode(
        self, problem: Problem, dummy: ForwardBatch, layers: tuple[int, ...] = (LAYER,)
    ) -> CapturedDecode:
        """The core's protocol: ``init_graph_capture``, ``prepare_capture(dummy)``, a warm-up
        outside the graph, then the ``forward`` of each of ``layers`` in turn captured in one
        graph on fixed q/k/v tensors."""
        config, backend, n = problem.config, problem.backend, dummy.batch_size

        def zeros(heads: int) -> list[torch.Tensor]:
            return [
                torch.zeros(n, heads, config.head_dim, dtype=self.dtype, device=self.device) for _ in layers
            ]

        q, k, v = zeros(config.num_qo_heads), zeros(config.num_kv_heads), zeros(config.num_kv_heads)
        backend.init_graph_capture(n)
        backend.prepare_capture(dummy)
        side = torch.cuda.Stream(device=self.device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside the graph, as the core does
            for i, layer_id in enumerate(layers):
                backend.forward(q[i], k[i], v[i], layer_id, dummy)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = [backend.forward(q[i], k[i], v[i], layer_id, dummy) for i, layer_id in enumerate(layers)]
        return CapturedDecode(graph, layers, q, k, v, out)

    def replay_and_check(
        self,
        problem: Problem,
        generator: torch.Generator,
        captured: CapturedDecode,
        dummy: ForwardBatch,
        batch: ForwardBatch,
        rows: Sequence[int],
    ) -> None:
        """Store the prefixes of ``batch`` (sequences ``rows``) in each captured layer, copy its
        inputs into the captured ones, ``prepare_replay(batch)``, replay and check each layer's
        output and the pool."""
        config = problem.config
        steps = []
        for i, layer_id in enumerate(captured.layers):
            keys, values = ([d[r] for r in rows] for d in (problem.keys[layer_id], problem.values[layer_id]))
            store_prefixes(config.kv_cache, layer_id, batch, keys, values)
            inputs = self.step_inputs(problem, generator, batch, layer_id, rows)
            for static, value in zip((captured.q[i], captured.k[i], captured.v[i]), inputs, strict=True):
                static.copy_(value)
            steps.append(inputs)
        for name in ("input_ids", "positions", "out_cache_loc"):
            getattr(dummy, name).copy_(getattr(batch, name))
        problem.backend.prepare_replay(batch)
        pool_before = config.kv_cache.buffer.clone()
        captured.graph.replay()
        torch.cuda.synchronize(self.device)
        for layer_id, (_, k, v) in zip(captured.layers, steps, strict=True):  # every layer's writes
            flat = pool_before[layer_id].view(2, -1, config.num_kv_heads, config.head_dim)
            flat[0, batch.out_cache_loc] = k.to(config.kv_cache.dtype)
            flat[1, batch.out_cache_loc] = v.to(config.kv_cache.dtype)
        for i, layer_id in enumerate(captured.layers):
            self.check_step(problem, batch, layer_id, rows, steps[i], captured.out[i].clone(), pool_before)

    def test_cuda_graph_decode(self, shape: Shape, generator: torch.Generator) -> None:
        """Capture one decode step on a dummy batch, then replay it for two different real batches."""
        self.require("decode", "cuda_graph")
        if torch.device(self.device).type != "cuda":
            pytest.skip("CUDA graphs need a CUDA device")
        n = self.graph_batch_size
        real_lens = [self.randoms(generator, n, 1, self.max_seq_len) for _ in range(2)]
        problem = self.make_problem(shape, real_lens[0] + real_lens[1] + [1] * n, generator)
        dummy = self.batch(
            problem, generator, [1] * n, [1] * n, rows=range(2 * n, 3 * n), is_prefill=False, captured=True
        )
        captured = self.capture_decode(problem, dummy)

        for part, seq_lens in enumerate(real_lens):
            rows = list(range(part * n, (part + 1) * n))
            batch = self.batch(
                problem, generator, seq_lens, [1] * n, rows=rows, is_prefill=False, captured=True
            )
            self.replay_and_check(problem, generator, captured, dummy, batch, rows)

    # --- cascade (shared prefixes) ---

    def shared_prefix_problem(
        self,
        shape: Shape,
        generator: torch.Generator,
        plan: Sequence[int],
        extra: int = 0,
        **problem_kw: Any,
    ) -> tuple[Problem, list[int], list[SharedPrefix]]:
        """A decode batch laid out by ``plan`` (a group of that many sequences for each entry
        > 1, a lone sequence for each 1) whose groups really share their prefix's pages, as the
        prefix cache makes them: members' page-table rows point at the first member's slots and
        their K/V there is the first member's. ``extra`` more lone sequences follow in the
        problem (not in the batch); ``problem_kw`` go to :meth:`make_problem`. Returns the
        problem, the batch's lengths and its groups."""
        page, longest = shape.page_size, self.max_seq_len
        seq_lens: list[int] = []
        groups: list[SharedPrefix] = []
        for size in plan:
            if size == 1:
                seq_lens.append(self.randoms(generator, 1, 1, longest)[0])
                continue
            length = page * self.randoms(generator, 1, 1, (longest - 1) // page)[0]
            lens = self.randoms(generator, size, length + 1, longest)
            lens[0] = length + 1  # one member's suffix is just its new token
            groups.append(SharedPrefix(len(seq_lens), len(seq_lens) + size, length))
            seq_lens += lens
        capacities = seq_lens + self.randoms(generator, extra, 1, longest)
        problem = self.make_problem(shape, capacities, generator, **problem_kw)
        table, rows = problem.layout.page_table, problem.layout.req_slots.long()
        for g in groups:
            for member in range(g.start + 1, g.end):
                table[rows[member], : g.length] = table[rows[g.start], : g.length]
                for dense in (*problem.keys, *problem.values):
                    dense[member][: g.length] = dense[g.start][: g.length]
        return problem, seq_lens, groups

    def test_cascade_decode(self, shape: Shape, generator: torch.Generator) -> None:
        """Decode with ``shared_prefixes``: groups of several sizes between lone sequences,
        including a member whose suffix is only its new token, equals plain attention."""
        self.require("decode", "cascade")
        problem, seq_lens, groups = self.shared_prefix_problem(shape, generator, [1, 3, 1, 2, 4, 1])
        batch = self.batch(problem, generator, seq_lens, [1] * len(seq_lens), is_prefill=False)
        batch.shared_prefixes = groups
        store_prefixes(problem.config.kv_cache, LAYER, batch, problem.keys[LAYER], problem.values[LAYER])
        self.run_step(problem, generator, batch)

    def test_sliding_window_cascade_decode(self, generator: torch.Generator) -> None:
        """(API 2.7) A cascade decode step in a windowed layer: a window hides the start of a
        shared prefix from its members (the suite's sequences are mostly longer than it)."""
        self.require("decode", "cascade", "sliding_window")
        window = {"sliding_window": WINDOW, "window_layers": frozenset({LAYER})}
        shape = self.representative_shape()
        problem, seq_lens, groups = self.shared_prefix_problem(shape, generator, [1, 3, 2, 1], **window)
        batch = self.batch(problem, generator, seq_lens, [1] * len(seq_lens), is_prefill=False)
        batch.shared_prefixes = groups
        store_prefixes(problem.config.kv_cache, LAYER, batch, problem.keys[LAYER], problem.values[LAYER])
        self.run_step(problem, generator, batch)

    def test_cascade_decode_without_groups(self, generator: torch.Generator) -> None:
        """``shared_prefixes=[]`` (every sequence on its own) is plain attention too."""
        self.require("decode", "cascade")
        problem, seq_lens, _ = self.shared_prefix_problem(self.representative_shape(), generator, [1] * 5)
        batch = self.batch(problem, generator, seq_lens, [1] * len(seq_lens), is_prefill=False)
        batch.shared_prefixes = []
        store_prefixes(problem.config.kv_cache, LAYER, batch, problem.keys[LAYER], problem.values[LAYER])
        self.run_step(problem, generator, batch)

    def test_cuda_graph_cascade_decode(self, shape: Shape, generator: torch.Generator) -> None:
        """Capture a cascade decode step on a dummy batch of lone sequences, replay it for two
        real batches with different groups (fewer prefix entries than sequences: padding)."""
        self.require("decode", "cuda_graph", "cascade")
        if torch.device(self.device).type != "cuda":
            pytest.skip("CUDA graphs need a CUDA device")
        plans = [[3, 1, 2, 1, 1], [1, 4, 3]]
        n = sum(plans[0])
        problem, seq_lens, groups = self.shared_prefix_problem(shape, generator, plans[0] + plans[1], extra=n)
        dummy = self.batch(
            problem, generator, [1] * n, [1] * n, rows=range(2 * n, 3 * n), is_prefill=False, captured=True
        )
        dummy.shared_prefixes = []
        captured = self.capture_decode(problem, dummy)

        for part in range(2):
            rows = list(range(part * n, (part + 1) * n))
            batch = self.batch(
                problem,
                generator,
                seq_lens[part * n : (part + 1) * n],
                [1] * n,
                rows=rows,
                is_prefill=False,
                captured=True,
            )
            batch.shared_prefixes = [
                SharedPrefix(g.start - part * n, g.end - part * n, g.length)
                for g in groups
                if g.start in rows
            ]
            self.replay_and_check(problem, generator, captured, dummy, batch, rows)
