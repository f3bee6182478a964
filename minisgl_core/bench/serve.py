"""Online benchmark against a running server: streaming completions, latency percentiles, throughput."""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path
from typing import Any, NamedTuple

from minisgl_core.bench.workloads import BenchRequest


def percentile(values: list[float], q: float, digits: int | None = None) -> float | None:
    """The ``q``-th percentile of ``values`` (linear between ranks; rounded to ``digits`` when
    given); None for no values (printed as JSON null: NaN is not JSON). Inter-token latencies can
    be empty although tokens came: a busy server merges a stream's tokens into fewer chunks, down
    to one per request."""
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    value = ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)
    return value if digits is None else round(value, digits)


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text → {name{labels}: value} (comments skipped)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                out[name] = float(value)
            except ValueError:
                pass
    return out


class ServedModel(NamedTuple):
    name: str
    #: None when the server does not say (then prompts are sent as generated)
    vocab_size: int | None
    #: the longest prompt + output the server accepts, when it says
    max_model_len: int | None


def served_model(url: str, api_key: str | None = None) -> ServedModel:
    """The model the server at ``url`` serves (its first, as ``/v1/models`` lists them)."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        resp = httpx.get(f"{url.rstrip('/')}/v1/models", headers=headers, timeout=30)
    except httpx.HTTPError as exc:
        raise BenchError(f"cannot reach the server at {url}: {exc}; start it first (make serve)") from None
    if resp.status_code != 200:
        hint = " (--api-key?)" if resp.status_code in (401, 403) else ""
        raise BenchError(
            f"{url}/v1/models answered HTTP {resp.status_code}: {error_message(resp.content)}{hint}"
        )
    try:
        models = resp.json()["data"]
    except (ValueError, LookupError, TypeError):  # (not JSON, or no "data" list: a JSON traceback)
        raise BenchError(
            f"{url}/v1/models answered {resp.text[:80]!r}, not a list of models; is it a minisgl "
            "(OpenAI-compatible) server?"
        ) from None
    if not isinstance(models, list) or not models or not isinstance(models[0], dict) or "id" not in models[0]:
        raise BenchError(f"{url}/v1/models lists no model")
    return ServedModel(models[0]["id"], models[0].get("vocab_size"), models[0].get("max_model_len"))


def error_message(body: bytes) -> str:
    """What an error answer says: the message of OpenAI's ``{"error": {"message": ...}}`` (ours,
    and every OpenAI-compatible server's), else the start of the body as text, on one line."""
    try:
        message = json.loads(body)["error"]["message"]
    except (ValueError, LookupError, TypeError):
        message = None
    text = message if isinstance(message, str) else body[:200].decode(errors="replace")
    return " ".join(text.split()) or "(an empty body)"


def check_context(requests: list[BenchRequest], served: ServedModel) -> None:
    """A workload the server would answer with 400s is refused up front, saying what fits."""
    longest = max((len(r.prompt_ids) + r.max_tokens for r in requests), default=0)
    if served.max_model_len is not None and longest > served.max_model_len:
        raise BenchError(
            f"the workload's longest request needs {longest} tokens (prompt + output) but {served.name} "
            f"accepts {served.max_model_len}; use a shorter workload (e.g. --workload shared-prefix "
            f"--prefix-len/--question-len/--output-len) or a server with room for it (its max_model_len is the "
            "smaller of its --max-context-len and its KV pool, --num-kv-tokens)"
        )


def prompt_texts(requests: list[BenchRequest], tokenizer_dir: str) -> list[str]:
    """Each request's prompt as text for a server that takes text only, which the served model's
    tokenizer encodes back to exactly the workload's length: every id is mapped onto one of the
    tokenizer's whole words (a space and letters, each encoding to itself; equal ids to equal
    words, so shared prefixes stay shared), and the texts are checked. Decoding the ids themselves
    does not round-trip: a bench model's padded vocabulary re-encoded 2.6x longer."""
    tokenizer = served_tokenizer(tokenizer_dir)
    words = whole_words(tokenizer)
    if len(words) < MIN_WORDS:
        raise BenchError(
            f"the tokenizer in {tokenizer_dir!r} has {len(words)} whole-word tokens (a space and letters), "
            f"fewer than {MIN_WORDS}: text prompts of the workload's lengths cannot be built; send token ids "
            "(leave out --tokenizer)"
        )
    texts = ["".join(words[t % len(words)] for t in r.prompt_ids) for r in requests]
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
    for r, ids in zip(requests, encoded, strict=True):
        if len(ids) != len(r.prompt_ids):  # a tokenizer that merges across words
            raise BenchError(
                f"the tokenizer in {tokenizer_dir!r} encodes a {len(r.prompt_ids)}-token prompt's text to "
                f"{len(ids)} tokens: send token ids (leave out --tokenizer)"
            )
    return texts


def served_tokenizer(model: str) -> Any:
    """The tokenizer in ``model`` as the engine loads it: a folder of tokenizer files (a Hugging
    Face model's, or a bench model's without weights), else through the model's weight format, so
    a GGUF file or the folder holding one (the default model's) works too (AutoTokenizer alone
    wanted tokenizer files there and named sentencepiece)."""
    from minisgl_core.checkpoint.formats import TOKENIZER_FILES
    from minisgl_core.tokenizer.load import load_tokenizer, load_tokenizer_dir

    path = Path(model).expanduser()
    if not path.exists():
        raise BenchError(
            f"--tokenizer {model!r}: no such file or folder: give the served model's folder (or its .gguf file)"
        )
    try:
        if path.is_dir() and any((path / name).exists() for name in TOKENIZER_FILES):
            return load_tokenizer_dir(path)
        return load_tokenizer(path)
    except (OSError, ValueError) as exc:  # ModelPathError is a ValueError
        reason = " ".join(str(exc).split())  # one line
        raise BenchError(f"cannot load a tokenizer from {model!r}: {reason}") from None


#: fewest whole-word tokens to build text prompts from (ids share words modulo this many)
MIN_WORDS = 64


def whole_words(tokenizer) -> list[str]:
    """The vocabulary's tokens that are a space and ASCII letters and encode to themselves alone,
    in id order: text joined from them splits back into the same tokens (byte-level BPE
    pre-tokenizers split before each space)."""
    ids = [[i] for i in range(len(tokenizer))]
    # a fast tokenizer's own batch calls (Rust, threaded): on 2 cores 1.0 s for a bench model's
    # 151,936 ids against 2.4 s through the Python wrapper; the same texts and ids (the space
    # cleanup decode() may add touches no space-and-letters piece)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        pieces = backend.decode_batch(ids, skip_special_tokens=False)
    else:
        pieces = [tokenizer.decode(i) for i in ids]
    candidates = [
        (i, p)
        for i, p in enumerate(pieces)
        if len(p) > 1 and p[0] == " " and p[1:].isascii() and p[1:].isalpha()
    ]
    texts = [p for _, p in candidates]
    if backend is not None:
        encoded = [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]
    else:
        encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return [p for (i, p), ids in zip(candidates, encoded, strict=True) if ids == [i]]


def fit_vocab(requests: list[BenchRequest], vocab_size: int | None) -> list[BenchRequest]:
    """The workload with every prompt token id folded into [0, vocab_size): same lengths, and equal
    ids stay equal, so shared prefixes stay shared."""
    if vocab_size is None or all(t < vocab_size for r in requests for t in r.prompt_ids):
        return requests
    return [r._replace(prompt_ids=[t % vocab_size for t in r.prompt_ids]) for r in requests]


def for_sweep_point(requests: list[BenchRequest], point: int, vocab_size: int | None) -> list[BenchRequest]:
    """The workload of a sweep's ``point``-th run (0: the workload itself): every prompt token id
    moved ``point`` places round the vocabulary, so a point finds none of the earlier points'
    prompts in the server's prefix cache (each would otherwise run on the cache the last left warm)
    while its lengths, and its shared prefixes among themselves, stay the workload's."""
    if point == 0:
        return requests
    if vocab_size is None:
        vocab_size = max(t for r in requests for t in r.prompt_ids) + 1 + point
    return [r._replace(prompt_ids=[(t + point) % vocab_size for t in r.prompt_ids]) for r in requests]


class BenchError(RuntimeError):
    """The benchmark cannot run; the message says why and what to do."""


#: the servers ``bench serve`` speaks to: ours (OpenAI completions, token ids or text, the usage
#: in the stream, /metrics) and mini-sglang's (the peer in shared/peer): its server takes a text
#: ``prompt`` at /v1/chat/completions only, always streams, one chunk per token it generates, and
#: reports neither usage nor metrics (at its commit 20fcd7f)
SERVERS = ("minisgl", "mini-sglang")


def request_body(server: str, model: str, req: BenchRequest, text: str | None) -> tuple[str, dict[str, Any]]:
    """The path and JSON body of one benchmark request to ``server`` (``text``: the prompt as text,
    else its token ids)."""
    prompt: str | list[int] = req.prompt_ids if text is None else text
    body = {"model": model, "prompt": prompt, "max_tokens": req.max_tokens, "temperature": 0.6,
            "ignore_eos": True, "stream": True}  # fmt: skip
    if server == "mini-sglang":
        if text is None:
            raise BenchError("mini-sglang's server takes text prompts only: give --tokenizer")
        return "/v1/chat/completions", body
    return "/v1/completions", {**body, "stream_options": {"include_usage": True}}


def chunk_tokens(server: str, chunk: dict[str, Any]) -> tuple[bool, int | None]:
    """What one streamed chunk says: whether it carries output (a time stamp), and the output
    token count when it states one. mini-sglang states none: each of its chunks but the last
    (``finish_reason`` set, an empty delta) is one token."""
    choices = chunk.get("choices") or []
    if server == "mini-sglang":
        carries = bool(choices) and choices[0].get("finish_reason") is None
        return carries, None
    usage = chunk.get("usage")
    return bool(choices), (usage["completion_tokens"] if usage else None)


async def _one(
    client, url: str, model: str, req: BenchRequest, headers: dict[str, str], server: str = "minisgl",
    text: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    path, body = request_body(server, model, req, text)
    start = time.monotonic()
    stamps: list[float] = []
    tokens = 0
    async with client.stream("POST", f"{url}{path}", json=body, headers=headers) as resp:
        if resp.status_code != 200:  # (a raw RuntimeError was a 30-line traceback)
            hint = "; check --api-key" if resp.status_code in (401, 403) else ""
            raise BenchError(
                f"the server answered HTTP {resp.status_code}: {error_message(await resp.aread())}{hint}"
            )
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            try:
                chunk = json.loads(line[6:])
            except ValueError:
                raise BenchError(f"the server sent an event that is not JSON: {line[:80]!r}") from None
            if isinstance(chunk, dict) and "error" in chunk:
                # (the request failed mid-stream, an engine gone say: it was counted as 0 tokens
                # and the run exited 0 with figures that hid it)
                raise BenchError(
                    f"the server answered an error mid-stream: {error_message(line[6:].encode())}"
                )
            if not isinstance(chunk, dict):
                raise BenchError(f"the server sent an event that is not a JSON object: {line[:80]!r}")
            carries, stated = chunk_tokens(server, chunk)
            if stated is not None:
                tokens = stated
            if carries:
                stamps.append(time.monotonic())
    if server == "mini-sglang":
        tokens = len(stamps)
    return {"start": start, "stamps": stamps, "output_tokens": tokens, "prompt_len": len(req.prompt_ids)}


async def run_load(
    url: str, model: str, requests: list[BenchRequest], *, concurrency: int | None = None,
    request_rate: float | None = None, api_key: str | None = None, seed: int = 0, trace: str | None = None,
    server: str = "minisgl", texts: list[str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Run ``requests`` against the server (``server``, one of :data:`SERVERS`; ``texts``: the
    prompts as text, one per request, else their token ids are sent); with ``trace``, also append
    one JSON line per request (monotonic seconds: sent, first chunk, last chunk; chunks and tokens)
    to that file, on the clock of the server's step trace (MINISGL_STEP_TRACE) when both run on one
    machine."""
    import ssl

    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    # One single-connection client per request in flight, reused: httpcore's pool scans every
    # connection of a pool on each request start and end, which with hundreds of open streams made
    # the client, not the server, the bottleneck (and delayed the requests it sent). They share
    # one TLS context (each would otherwise load the CA bundle: 16 ms) and exist before the clock
    # starts.
    idle: list[httpx.AsyncClient] = []
    every: list[httpx.AsyncClient] = []
    one = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    tls = ssl.create_default_context()

    def checkout() -> httpx.AsyncClient:
        if idle:
            return idle.pop()
        client = httpx.AsyncClient(timeout=None, limits=one, verify=tls)
        every.append(client)
        return client

    rng = random.Random(seed)
    gate = asyncio.Semaphore(concurrency or len(requests))

    async def gated(req: BenchRequest, text: str | None) -> dict[str, Any]:
        async with gate:
            client = checkout()
            try:
                return await _one(client, url, model, req, headers, server, text)
            finally:
                idle.append(client)

    try:
        idle += [checkout() for _ in range(min(concurrency or 0, len(requests)))]
        control = checkout()
        before = parse_metrics((await control.get(f"{url}/metrics", headers=headers)).text)
        idle.append(control)
        start = time.monotonic()
        tasks = []
        for i, req in enumerate(requests):
            tasks.append(asyncio.create_task(gated(req, None if texts is None else texts[i])))
            if request_rate and i + 1 < len(requests):  # (a gap after the last was timed too)
                await asyncio.sleep(rng.expovariate(request_rate))
        try:
            results = await asyncio.gather(*tasks)
        except BaseException:  # one failed: the others stop with it, before their clients close
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        elapsed = time.monotonic() - start
        after = await _settled_metrics(checkout(), url, headers, before)
    except httpx.TransportError as exc:  # (the server killed mid-run: httpx's 30-line traceback)
        raise BenchError(
            f"lost the server at {url} mid-run ({type(exc).__name__}: {exc or 'no detail'}): is it still running?"
        ) from None
    finally:
        await asyncio.gather(*(c.aclose() for c in every))
    ttft = [(r["stamps"][0] - r["start"]) * 1000 for r in results if r["stamps"]]
    itl = [(b - a) * 1000 for r in results for a, b in zip(r["stamps"], r["stamps"][1:])]
    tpot = [
        (r["stamps"][-1] - r["stamps"][0]) * 1000 / (r["output_tokens"] - 1)
        for r in results
        if r["output_tokens"] > 1 and len(r["stamps"]) > 1
    ]
    out_tokens = sum(r["output_tokens"] for r in results)
    if trace:
        with open(trace, "a") as f:
            for i, r in enumerate(results):
                stamps = r["stamps"]
                record = {"i": i, "sent": round(r["start"], 6), "first": round(stamps[0], 6) if stamps else None,
                          "last": round(stamps[-1], 6) if stamps else None, "chunks": len(stamps),
                          "tokens": r["output_tokens"], "prompt_len": r["prompt_len"]}  # fmt: skip
                f.write(json.dumps(record) + "\n")
    return {
        "requests": len(requests), "concurrency": concurrency, "request_rate": request_rate,
        "seconds": round(elapsed, 3), "output_tokens": out_tokens,
        "output_tok_per_s": round(out_tokens / elapsed, 1), "req_per_s": round(len(requests) / elapsed, 3),
        "ttft_ms_p50": percentile(ttft, 50, 2), "ttft_ms_p99": percentile(ttft, 99, 2),
        "tpot_ms_p50": percentile(tpot, 50, 3), "tpot_ms_p99": percentile(tpot, 99, 3),
        "itl_ms_p50": percentile(itl, 50, 3), "itl_ms_p99": percentile(itl, 99, 3),
        # streamed chunks that carried output: more than one per request, or there is no gap
        # between them to time (itl null)
        "output_chunks": sum(len(r["stamps"]) for r in results),
        "prefix_hit_rate": _hit_rate(before, after), "server": server, "text_prompts": texts is not None,
        "expected_output_tokens": sum(r.max_tokens for r in requests),
        # what the workload says, and what the server counted (ours; None from mini-sglang): equal,
        # also for text prompts, unless the server adds special tokens (a BOS: one per request)
        "prompt_tokens": sum(len(r.prompt_ids) for r in requests),
        "prompt_tokens_served": _served_prompt_tokens(before, after),
        "short_requests": short_requests(results, requests),
    }  # fmt: skip


def short_requests(results: list[dict[str, Any]], requests: list[BenchRequest]) -> int:
    """How many requests came back with fewer tokens than their ``max_tokens`` (the workloads
    ignore EOS, so each should return all of them): 0 from our server; where a server states no
    count (mini-sglang), its chunks are the count, and this says whether a shortfall is spread
    over many requests or sits in a few."""
    return sum(r["output_tokens"] < q.max_tokens for r, q in zip(results, requests, strict=True))


#: how long the metrics may lag the last response (the scheduler reports its counters every 0.25 s
#: while busy and once more when it goes idle)
SETTLE_SECONDS = 5.0


def _delta(before: dict[str, float], after: dict[str, float], name: str) -> float | None:
    return after[name] - before.get(name, 0.0) if name in after else None


async def _settled_metrics(
    client, url: str, headers: dict[str, str], before: dict[str, float]
) -> dict[str, float]:
    """The server's metrics once the scheduler's counters cover every prompt the server accepted
    during the run: the hit counters come from the scheduler's reports, which can arrive after the
    last response (read at once, a short run's hit rate came out as a third of the true one)."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while True:
        after = parse_metrics((await client.get(f"{url}/metrics", headers=headers)).text)
        admitted = _delta(before, after, "minisgl_admitted_prompt_tokens_total")
        accepted = _delta(before, after, "minisgl_prompt_tokens_total")
        if admitted is None or accepted is None or admitted >= accepted or time.monotonic() > deadline:
            return after
        await asyncio.sleep(0.05)


def _served_prompt_tokens(before: dict[str, float], after: dict[str, float]) -> int | None:
    accepted = _delta(before, after, "minisgl_prompt_tokens_total")
    return None if accepted is None else int(accepted)


def _hit_rate(before: dict[str, float], after: dict[str, float]) -> float | None:
    prompt = _delta(before, after, "minisgl_admitted_prompt_tokens_total")
    if prompt is None:  # a server without the admitted counter
        prompt = _delta(before, after, "minisgl_prompt_tokens_total")
    cached = _delta(before, after, "minisgl_prefix_cache_hit_tokens_total")
    if not prompt or cached is None:
        return None
    return round(cached / prompt, 4)
