"""Constrained decoding in the offline benchmark: the schema every request follows, and how long
the grammar backend takes to get ready for it."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from minisgl_core.api import GrammarSpec
from minisgl_core.bench.shapes import TRAINED_TOKENS
from minisgl_core.config import ConfigError
from minisgl_core.llm import LLM

if TYPE_CHECKING:
    from minisgl_core.plugins import Plugins

#: ``--grammar-schema builtin``
BUILTIN = "builtin"


def unending_schema(max_tokens: int) -> dict[str, Any]:
    """An array of at least ``max_tokens`` bounded objects: every object is longer than one token,
    so no request can finish it (and stop early) before its max_tokens."""
    item = {
        "type": "object",
        "properties": {
            "id": {"type": "integer", "minimum": 0, "maximum": 9999},
            "label": {"enum": ["alpha", "beta", "gamma", "delta"]},
            "score": {"type": "number", "minimum": 0, "maximum": 1},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 4},
        },
        "required": ["id", "label", "score", "tags"],
        "additionalProperties": False,
    }
    return {"type": "array", "items": item, "minItems": max_tokens}


def schema_spec(source: str, max_tokens: int) -> GrammarSpec:
    """The spec for ``--grammar-schema``: ``builtin`` (:func:`unending_schema`) or a JSON schema file."""
    if source == BUILTIN:
        return GrammarSpec("json_schema", json.dumps(unending_schema(max_tokens)))
    text = Path(source).read_text()
    json.loads(text)  # a clear error for a file that is not JSON
    return GrammarSpec("json_schema", text)


def check_schema(model: str, plugins: Plugins, backend_name: str, spec: GrammarSpec) -> None:
    """GrammarError when the grammar backend refuses ``spec``, from the model's tokenizer alone:
    before the weights load (a bad schema was found only after them, a minute for an 8B model).
    The engine builds its own backend once it has loaded; this one is dropped."""
    from minisgl_core.grammars import make_grammar_backend
    from minisgl_core.tokenizer.load import load_tokenizer

    tokenizer = load_tokenizer(model, plugins)
    eos = tokenizer.eos_token_id
    backend = make_grammar_backend(
        plugins,
        backend_name,
        tokenizer,
        vocab_size=len(tokenizer),
        stop_token_ids=[] if eos is None else [eos],
    )
    backend.check(spec)


def prepare(llm: LLM, spec: GrammarSpec) -> dict[str, Any]:
    """Build the engine's grammar backend and compile ``spec`` (outside the timed run), timing both."""
    lazy = llm.engine.grammars.backend
    start = time.perf_counter()
    backend = lazy.get()
    built = time.perf_counter()
    backend.compile(spec)
    compiled = time.perf_counter()
    return {
        "grammar_backend": lazy.name,
        "grammar_backend_init_s": round(built - start, 3),
        "grammar_compile_s": round(compiled - built, 3),
        "grammar_schema_chars": len(spec.value),
    }


# ---------------------------------------------------------------------- host time per decode step


def bench_tokenizer(vocab_size: int, cache: Path) -> Path:
    """The tokenizer ``bench make-model`` gives its random-weight models (:data:`TRAINED_TOKENS`
    trained tokens at most, padded with filler words to ``vocab_size``), built once under ``cache``:
    the GPU run's vocabulary."""
    from minisgl_core.demo.factories import pad_vocab, train_tokenizer

    out = cache / f"tokenizer-{vocab_size}"
    if not (out / "tokenizer.json").is_file():
        out.mkdir(parents=True, exist_ok=True)
        train_tokenizer(out, vocab_size=TRAINED_TOKENS)
        pad_vocab(out, vocab_size)
    return out


def check_steps(steps: int, warm_steps: int) -> None:
    """Enough timed steps for each path to have a figure: fill and accept take turns (serial,
    batched) step by step, and the first step has no token to accept yet (a KeyError at the end of
    the run before)."""
    least = 2 if warm_steps > 0 else 3
    if steps < least:
        raise ConfigError(
            f"steps must be at least 2, or 3 with warm_steps 0 (got {steps} with {warm_steps}): the "
            "serial and batched paths take turns, and the first step has nothing to accept",
            "steps",
            "warm_steps",
        )


def host_step_bench(
    backend_name: str = "xgrammar",
    *,
    rows: int = 256,
    steps: int = 24,
    warm_steps: int = 24,
    vocab_size: int = 151936,
    fill_threads: int | None = None,
    schema: str = BUILTIN,
    max_tokens: int = 1024,
    cache: Path = Path("/tmp/minisgl-bench-models"),
    seed: int = 0,
    plugins: Plugins | None = None,
) -> dict[str, Any]:
    """Host time of one decode step's grammar work with ``rows`` constrained requests, the engine's
    own code path (:class:`~minisgl_core.engine.grammar.GrammarRunner`), serial (one matcher at a
    time, as before the batched API) against batched, in the same process on the same states.

    Every request follows ``schema``; each step the sampler's mask is applied to uniformly random
    logits (what a random-weight model gives) and the argmax taken, so the matchers walk the
    grammar as they do in the GPU run. Per timed step: the fill by one path (serial on odd steps,
    batched on even ones; only a state's first fill is timed, as a library may keep the mask of a
    state), then by the other (the two masks must be equal, or this raises); the guard AND alone
    where the backend has one (xgrammar's JSON guard: per row as before, then vectorized), the copy to the
    device (CUDA only); accept alternates between the two paths too (it moves the matchers, so
    both cannot run on one state). Figures: milliseconds per step (median) and
    microseconds per row (mean). ``plugins``: the loaded :class:`~minisgl_core.plugins.Plugins`
    (loaded here when not given)."""
    check_steps(steps, warm_steps)
    import statistics

    import torch
    from transformers import AutoTokenizer

    from minisgl_core.engine.grammar import GrammarRunner
    from minisgl_core.grammars import LazyGrammarBackend
    from minisgl_core.plugins import Plugins
    from minisgl_core.runner.sampler import apply_token_bitmask
    from minisgl_core.sampling import SamplingParams
    from minisgl_core.scheduler.request import Request

    tokenizer = AutoTokenizer.from_pretrained(bench_tokenizer(vocab_size, cache))
    stop = [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    lazy = LazyGrammarBackend(
        plugins or Plugins.load(), backend_name, tokenizer, vocab_size=vocab_size, stop_token_ids=stop,
        fill_threads=fill_threads,
    )  # fmt: skip
    started = time.perf_counter()
    backend = lazy.get()
    built = time.perf_counter()
    spec = schema_spec(schema, max_tokens)
    backend.compile(spec)
    compiled = time.perf_counter()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    serial = GrammarRunner(lazy, torch.device("cpu"), batched=False)
    batched = GrammarRunner(lazy, torch.device("cpu"), batched=True)
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, grammar=spec)
    reqs = [Request(rid=i, prompt_ids=[1], params=params, arrival=0) for i in range(rows)]
    for req in reqs:
        batched.attach(req)
    live = {r.rid: r for r in reqs}
    gen = torch.Generator().manual_seed(seed)
    everyone = torch.arange(rows)

    def sample(mask: torch.Tensor) -> list[int]:
        logits = torch.rand(rows, vocab_size, generator=gen)
        return apply_token_bitmask(logits, everyone, mask).argmax(dim=1).tolist()

    def timed(fn: Any, *args: Any) -> tuple[float, Any]:
        t = time.perf_counter()
        out = fn(*args)
        return time.perf_counter() - t, out

    def guard_per_row(mask: torch.Tensor) -> None:  # what each matcher did before
        for i in range(rows):
            mask[i] &= guard.always

    def copy(pinned: torch.Tensor) -> None:
        pinned.to(device, non_blocking=True)
        torch.cuda.synchronize()

    times: dict[str, list[float]] = {k: [] for k in (
        "fill_serial", "fill_batched", "guard_per_row", "guard_vectorized", "copy",
        "accept_serial", "accept_batched",
    )}  # fmt: skip
    guard = getattr(backend, "_json_guard", None) if backend_name == "xgrammar" else None
    tokens: list[int] | None = None
    for step in range(warm_steps + steps):
        record = step >= warm_steps
        if tokens is not None:
            runner = serial if step % 2 else batched
            dt, _ = timed(runner.accept, reqs, tokens, live)
            if record:
                times["accept_serial" if runner is serial else "accept_batched"].append(dt)
        # Only the first fill of a state is timed: a library may keep the mask it computed for
        # the state (llguidance does), so the second would measure a cache hit.
        first, second = (serial, batched) if step % 2 else (batched, serial)
        dt, filled = timed(first.fill, reqs)
        filled_again = second.fill(reqs)
        assert filled is not None and filled_again is not None
        if not torch.equal(filled[1], filled_again[1]):
            raise RuntimeError(f"step {step}: the batched fill differs from the serial one")
        mask = filled[1]
        if record:
            times["fill_serial" if first is serial else "fill_batched"].append(dt)
            if guard is not None:
                scratch = mask.clone()
                times["guard_per_row"].append(timed(guard_per_row, scratch)[0])
                dt, _ = timed(guard.apply, scratch, list(range(rows)), [])
                times["guard_vectorized"].append(dt)
            if device.type == "cuda":
                times["copy"].append(timed(copy, mask.pin_memory())[0])
        tokens = sample(mask)
    errors = [r.grammar_error for r in reqs if r.grammar_error is not None]
    if errors:
        raise RuntimeError(f"{len(errors)} matchers failed, e.g. {errors[0]}")
    result: dict[str, Any] = {
        "bench": "grammar-host", "grammar_backend": backend_name, "rows": rows, "steps": steps,
        "warm_steps": warm_steps, "vocab_size": vocab_size, "fill_threads": backend.fill_threads,
        "cpus": _cpus(), "grammar_backend_init_s": round(built - started, 3),
        "grammar_compile_s": round(compiled - built, 3), "grammar_schema_chars": len(spec.value),
    }  # fmt: skip
    for name, values in times.items():
        if values:
            result[f"{name}_ms"] = round(statistics.median(values) * 1e3, 3)
            result[f"{name}_us_per_row"] = round(statistics.fmean(values) * 1e6 / rows, 2)
    for what in ("fill", "accept", "guard"):
        before = result.get(f"{what}_serial_ms", result.get(f"{what}_per_row_ms"))
        after = result.get(f"{what}_batched_ms", result.get(f"{what}_vectorized_ms"))
        if before and after:
            result[f"{what}_speedup"] = round(before / after, 2)
    before = result["fill_serial_ms"] + result["accept_serial_ms"]
    after = result["fill_batched_ms"] + result["accept_batched_ms"]
    result |= {"step_serial_ms": round(before, 3), "step_batched_ms": round(after, 3),
               "step_speedup": round(before / after, 2)}  # fmt: skip
    return result


def _cpus() -> int:
    import os

    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
