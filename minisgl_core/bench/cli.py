"""`minisgl bench offline | serve | make-model`."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import math
import os
import platform
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from minisgl_core import environment
from minisgl_core.api import GrammarError
from minisgl_core.bench import workloads
from minisgl_core.bench.serve import SERVERS
from minisgl_core.bench.shapes import SHAPES, TRAINED_TOKENS, built_before
from minisgl_core.config import MAX_GRAMMAR_THREADS, ConfigError, check_grammar_threads
from minisgl_core.sampling import cut, short_repr


def add_bench_command(sub) -> None:
    from minisgl_core.config_args import add_engine_args

    bench = sub.add_parser("bench", help="benchmarks (offline throughput, online serving)")
    kinds = bench.add_subparsers(dest="bench_kind", required=True)

    p = kinds.add_parser("offline", help="offline throughput on the standard workload")
    add_engine_args(p)
    p.add_argument("--shape", choices=sorted(SHAPES), help="build a random-weight model of this real shape")
    p.add_argument(
        "--model-cache", type=_model_cache, default="/tmp/minisgl-bench-models",
        help="where --shape's models are built, once each (default: %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--num-requests", type=_positive_int, default=256,
        help="requests of the standard workload (default: %(default)s, its standard size; another N "
        "draws N prompts, then N output lengths, as nano-vllm's bench does: not the first N of the 256)",
    )  # fmt: skip
    p.add_argument(
        "--temperature", type=_temperature, default=0.6, help="sampling temperature (default: %(default)s)"
    )
    p.add_argument("--decode-latency", action="store_true", help="also measure batch-1 decode ms/token")
    p.add_argument(
        "--grammar-schema",
        type=_schema_source,
        metavar="FILE|builtin",
        help="constrain every request by this JSON schema (builtin: an array of objects too long to "
        "end before max_tokens); reports the schema's compile time too",
    )
    p.add_argument("--label", default="", help="a free text kept in the JSON result (to tell runs apart)")
    p.add_argument(
        "--profile", type=_writable, help="write a cProfile report (host time) of the timed run to this file"
    )
    p.add_argument(
        "--output", type=_writable, help="append the JSON result to this file (one object per line)"
    )
    p.set_defaults(func=_offline)

    p = kinds.add_parser("serve", help="online benchmark against a running server")
    p.add_argument(
        "--url", type=_server_url, default="http://127.0.0.1:8000", help="the server (default: %(default)s)"
    )
    p.add_argument("--model", default=None, help="model id to request (default: the one the server lists)")
    p.add_argument(
        "--api-key",
        default=environment.get("MINISGL_API_KEY") or None,
        help="the server's API key (env MINISGL_API_KEY, as serve and shell take it)",
    )
    p.add_argument(
        "--workload", choices=["standard", "shared-prefix"], default="standard",
        help="standard: random prompts of 100-1,024 tokens, 100-1,024 output tokens; shared-prefix: "
        "--groups of --prompts-per-group prompts sharing a --prefix-len prefix (default: %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--num-requests", type=_positive_int, default=256,
        help="requests of the standard workload (default: %(default)s; another N draws its own N, "
        "not the first N of the 256)",
    )  # fmt: skip
    p.add_argument(
        "--concurrency", type=_positive_ints, default=None,
        help="comma-separated sweep, e.g. 1,16,64 (each point after the first moves the prompts' token "
        "ids by its index round the vocabulary: none runs on the prompts an earlier point cached)",
    )  # fmt: skip
    p.add_argument(
        "--request-rate", type=_rate_sweep, default=None,
        help="comma-separated requests/s sweep (Poisson arrivals; each point on its own prompts, as "
        "--concurrency's)",
    )  # fmt: skip
    p.add_argument(
        "--groups", type=_positive_int, default=64, help="shared-prefix: prefixes (default: %(default)s)"
    )
    p.add_argument(
        "--prompts-per-group", type=_positive_int, default=16,
        help="shared-prefix: prompts per prefix (default: %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--prefix-len", type=_positive_int, default=2048,
        help="shared-prefix: tokens of each shared prefix (default: %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--question-len", type=_non_negative_int, default=128,
        help="shared-prefix: tokens after the prefix, each prompt's own (default: %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--output-len", type=_positive_int, default=256,
        help="shared-prefix: output tokens per request (default: %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--seed", type=_non_negative_int, default=0,
        help="the workload's random seed: another seed, other prompts (and prefixes nothing cached yet)",
    )  # fmt: skip
    p.add_argument(
        "--server", choices=SERVERS, default="minisgl",
        help="the server's kind: minisgl, or mini-sglang's server (the peer: text prompts only, at its "
        "/v1/chat/completions; no usage or metrics)",
    )  # fmt: skip
    p.add_argument(
        "--tokenizer", metavar="DIR", type=_tokenizer,
        help="send the prompts as text decoded by this tokenizer (the served model's folder or .gguf file); "
        "needed with --server mini-sglang",
    )  # fmt: skip
    p.add_argument("--label", default="", help="a free text kept in the JSON result (to tell runs apart)")
    p.add_argument(
        "--output", type=_writable, help="append the JSON result to this file (one object per line)"
    )
    p.add_argument(
        "--trace",
        type=_writable,
        help="append one JSON line per request (send, first and last chunk times) to this file",
    )
    p.set_defaults(func=_serve)

    p = kinds.add_parser(
        "grammar",
        help="host time per decode step of constrained decoding (fill, accept, guard, copy), serial vs batched",
    )
    p.add_argument(
        "--grammar-backend", default="xgrammar", help="the grammar plugin to time (default: %(default)s)"
    )
    p.add_argument("--rows", type=_positive_int, default=256, help="constrained requests in the batch")
    p.add_argument(
        "--steps", type=_int_range(1, MAX_GRAMMAR_BENCH_STEPS), default=24,
        help=f"timed decode steps (default: %(default)s, at most {MAX_GRAMMAR_BENCH_STEPS:,})",
    )  # fmt: skip
    p.add_argument(
        "--warm-steps", type=_int_range(0, MAX_GRAMMAR_BENCH_STEPS), default=24,
        help=f"steps walked before timing (default: %(default)s, at most {MAX_GRAMMAR_BENCH_STEPS:,})",
    )  # fmt: skip
    p.add_argument(
        "--vocab-size",
        type=_vocab_size,
        default=151936,
        help=f"at least {TRAINED_TOKENS}, the tokens of the tokenizer it trains (default: Qwen3's, %(default)s)",
    )
    p.add_argument(
        "--grammar-threads",
        type=int,
        default=None,
        help=f"1 to {MAX_GRAMMAR_THREADS} (default: half the CPUs, 1 to 16)",
    )
    p.add_argument(
        "--grammar-schema", type=_schema_source, default="builtin", metavar="FILE|builtin",
        help="the JSON schema every row follows (builtin: an array of objects, --max-tokens long; "
        "default: %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--max-tokens",
        type=_schema_length,
        default=1024,
        help="the builtin schema's length (default: %(default)s)",
    )
    p.add_argument(
        "--model-cache",
        type=_model_cache,
        default="/tmp/minisgl-bench-models",
        help="where the tokenizer is built",
    )
    p.add_argument("--label", default="", help="a free text kept in the JSON result (to tell runs apart)")
    p.add_argument(
        "--output", type=_writable, help="append the JSON result to this file (one object per line)"
    )
    p.set_defaults(func=_grammar)

    p = kinds.add_parser(
        "cpu", help="our offline LLM against transformers generate on the CPU, with the bandwidth bound"
    )
    add_engine_args(p)
    p.add_argument(
        "--threads",
        type=_cpu_threads,
        default=2,
        help="torch.set_num_threads for both engines, at most the CPUs (default: %(default)s)",
    )
    p.add_argument("--batch-sizes", type=_positive_ints, default=[1, 8], help="comma-separated batch sizes")
    p.add_argument("--max-new-tokens", type=_positive_int, default=64, help="new tokens per request")
    p.add_argument(
        "--rounds", type=_int_range(1, MAX_CPU_BENCH_ROUNDS), default=3,
        help=f"alternating runs per batch size (default: %(default)s, at most {MAX_CPU_BENCH_ROUNDS:,})",
    )  # fmt: skip
    p.add_argument("--no-transformers", action="store_true", help="measure ours only")
    p.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an extra LLM(...) option (repeatable; VALUE read as a Python literal when it is one), "
        "e.g. --engine-arg quantization=int8",
    )
    p.add_argument("--label", default="", help="a free text kept in the JSON result (to tell runs apart)")
    p.add_argument(
        "--output", type=_writable, help="append the JSON result to this file (one object per line)"
    )
    p.set_defaults(func=_cpu)

    p = kinds.add_parser("make-model", help="write a random-weight model of a real shape")
    p.add_argument(
        "--shape", choices=sorted(SHAPES), required=True, help="the real model whose shape to build"
    )
    p.add_argument(
        "--out",
        required=True,
        help="the model directory to write: a new one (made with its missing parents) or an empty one; "
        "one holding this shape built before is kept (nothing written; said on stderr, exit status 0), "
        "one holding anything else is refused",
    )
    p.add_argument(
        "--device",
        default="cpu",
        help="where the random weights are drawn (cuda: faster; default: %(default)s)",
    )
    p.set_defaults(func=_make_model)


def _make_model(args: argparse.Namespace) -> int:
    if not args.out.strip():  # ('' is the working directory: 1.2 GB was written there)
        _refuse("make-model", "--out is empty: give the folder to write the model to")
    _check_generator_device(args.device)
    if built_before(args.shape, args.out):  # (kept, exit 0: benchmark scripts run it before each use)
        print(Path(args.out))
        print(
            f"minisgl bench make-model: {args.out} already holds a model of this shape ({args.shape}); "
            "kept it, nothing written; give a new --out to build another",
            file=sys.stderr,
        )
        return 0
    try:
        print(_make(args.shape, Path(args.out), args.device))
    except FileExistsError as exc:
        _refuse("make-model", f"--out {exc}")
    except OSError as exc:
        _refuse(
            "make-model",
            f"cannot write {args.out}: {exc.strerror or exc}; give a folder you can write to with --out",
        )
    return 0


def _check_generator_device(device: str) -> None:
    """make-model's --device, where the weights are drawn, checked before anything is written: a
    device torch does not know was its traceback after the folders and the tokenizer were."""
    import torch

    try:
        parsed = torch.device(device)
    except RuntimeError:  # not a device string at all
        parsed = None
    if parsed is None or parsed.type not in ("cpu", "cuda"):
        raise ConfigError(f"device must be cpu, cuda or cuda:N; got {device!r}", "device")
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"device {device} was asked for but CUDA is not available here; use device cpu", "device"
        )
    if parsed.type == "cuda" and parsed.index is not None and parsed.index >= torch.cuda.device_count():
        raise ConfigError(f"device {device}: this machine has {torch.cuda.device_count()} GPU(s)", "device")


def _make(shape: str, out: Path, device: str, overwrite: bool = False) -> Path:
    from minisgl_core.bench.shapes import build_random_model

    return build_random_model(shape, out, device=device, overwrite=overwrite)


def _meta(args: argparse.Namespace) -> dict[str, Any]:
    # MINISGL_COMMIT: for copies of a checkout whose .git is not the one the run came from. The
    # checkout is the one this code runs from, not the working directory's (which named another
    # repository's commit, or none).
    here = Path(__file__).resolve().parent
    commit = (
        environment.get("MINISGL_COMMIT")
        or subprocess.run(
            ["git", "-C", str(here), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
    )
    device = "cpu"
    try:
        import torch

        if torch.cuda.is_available():
            device = f"{torch.cuda.device_count()}x {torch.cuda.get_device_name(0)}"
    except Exception:  # noqa: BLE001
        pass
    return {"date": time.strftime("%Y-%m-%d"), "commit": commit or "?", "hardware": device,
            "host": platform.node(), "label": args.label}  # fmt: skip


def _emit(result: dict[str, Any], path: str | None) -> None:
    line = json.dumps(result)
    print(line)
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


def _offline(args: argparse.Namespace) -> int:
    from minisgl_core.config_args import ENGINE_FIELDS, check_plugin_names, engine_config_from_args
    from minisgl_core.plugins import Plugins

    if args.shape and args.model is not None:  # (--shape silently won, building a model)
        raise ConfigError(f"give --shape or --model, not both (--shape {args.shape}, --model {args.model})")
    plugins = Plugins.load(disable=args.disable_plugin)
    # the plugin names first, here: with --shape a typo was found only after the model was built
    # (minutes on a CPU); engine_config_from_args then takes them as checked
    check_plugin_names({name: getattr(args, name) for name in ENGINE_FIELDS}, plugins)
    if args.shape:
        _warn_if_long_on_cpu(args)
        args.model = str(
            _make(
                args.shape, Path(args.model_cache) / args.shape, "cuda" if _cuda() else "cpu", overwrite=True
            )
        )
    config = engine_config_from_args(args, plugins=plugins, names_checked=True)
    _check_workload_size("offline", args.num_requests * workloads.STANDARD_MAX_PROMPT, "--num-requests")
    if config.tp_size > 1:
        from minisgl_core.config_args import check_heads_split

        if args.grammar_schema:
            raise ConfigError("--grammar-schema runs with tp_size 1 only", "tp_size")
        for flag, given in (("--decode-latency", args.decode_latency), ("--profile", args.profile)):
            if given:  # (the TP run measured neither and said nothing)
                raise ConfigError(f"{flag} runs with tp_size 1 only", "tp_size")
        # (heads that do not split over the ranks: one line, not every rank's traceback)
        check_heads_split(config.model, config.tp_size, plugins)
    if args.grammar_schema and args.grammar_schema != "builtin":  # (refused after the weights loaded)
        from minisgl_core.bench.grammar import check_schema, schema_spec

        try:
            check_schema(config.model, plugins, config.grammar_backend, schema_spec(args.grammar_schema, 1))
        except GrammarError as exc:
            return _schema_refused("offline", args.grammar_schema, exc)
    if not args.shape:  # (after every check of the flags: a refusal stays one line)
        _warn_if_long_on_cpu(args)
    requests = workloads.standard_offline(args.num_requests, seed=0)
    longest = max(len(r.prompt_ids) + r.max_tokens for r in requests)  # (the warm-up's are shorter)
    _check_requests_fit("offline", longest, config.max_context_len, config.num_kv_tokens)
    # from the model's config, before its weights load (the ranks found these only as tracebacks,
    # each its own; one process after its weights had loaded)
    from minisgl_core.checkpoint.buildable import model_config
    from minisgl_core.checkpoint.formats import open_model

    hf = model_config(open_model(config.model, plugins).hf_config(), plugins)
    _check_vocab_fits(requests, config.model, int(hf["vocab_size"]))
    context = config.context_len(hf)
    given = config.max_context_len
    _check_requests_fit("offline", longest, context, None, models_context=given is None or given > context)
    result: dict[str, Any] = {**_meta(args), "bench": "offline", "shape": args.shape or config.model,
                              "attn": config.attn, "tp": config.tp_size, "cuda_graph_max_bs": config.cuda_graph_max_bs,
                              "piecewise_cuda_graph_max_tokens": config.piecewise_cuda_graph_max_tokens,
                              "overlap": config.overlap, "quantization": config.quantization,
                              "kv_cache_dtype": config.kv_cache_dtype}  # fmt: skip
    if config.tp_size > 1:
        from minisgl_core.bench.tp import run_offline_tp

        result |= run_offline_tp(
            config,
            requests,
            args.temperature,
            disable_plugins=args.disable_plugin,
            progress_every=PROGRESS_EVERY,
        )
    else:
        from minisgl_core.bench.offline import decode_latency, run_offline
        from minisgl_core.llm import LLM

        started = time.perf_counter()
        # (the model checked by engine_config_from_args above: not again)
        llm = LLM.from_config(config, disable_plugins=args.disable_plugin, spelling="flag")
        # start-up (weights, KV pool, JIT, graph capture): a fresh machine's cost, outside the timed run
        result["init_seconds"] = round(time.perf_counter() - started, 1)
        try:
            _check_vocab_fits(requests, config.model, llm.engine.runner.vocab_size)
        except SystemExit:
            llm.close()
            raise
        try:  # (the context length may be the model's, the KV pool sized from the memory)
            _check_limits_fit("offline", longest, llm, config.max_context_len)
        except ConfigError:
            llm.close()
            raise
        result["attn"] = ",".join(llm.engine.runner.attn_names)
        result["overlap"] = llm.engine.overlap  # (speculation turns it off)
        result["page_size"] = llm.engine.config.page_size
        grammar = None
        if args.grammar_schema:
            from minisgl_core.bench.grammar import prepare, schema_spec

            grammar = schema_spec(args.grammar_schema, max(r.max_tokens for r in requests))
            try:
                result |= prepare(llm, grammar)
            except GrammarError as exc:
                llm.close()
                return _schema_refused("offline", args.grammar_schema, exc)
        if args.profile:
            import cProfile
            import pstats

            profiler = cProfile.Profile()
            result |= profiler.runcall(run_offline, llm, requests, args.temperature, grammar, PROGRESS_EVERY)
            with open(args.profile, "w") as f:
                stats = pstats.Stats(profiler, stream=f)
                stats.sort_stats("tottime").print_stats(40)
                stats.sort_stats("cumulative").print_stats(60)  # one-off costs (compiles) show here
        else:
            result |= run_offline(llm, requests, args.temperature, grammar, PROGRESS_EVERY)
        if args.decode_latency:
            result["decode"] = decode_latency(llm)
        verify = llm.engine.verify
        if verify is not None:
            result["speculative"] = verify.speculator.stats
    stats = result.pop("speculative", None)
    if stats is not None:  # --speculative-algorithm: how many tokens each verify step gave
        result["speculative"] = {
            "algorithm": config.speculative_algorithm,
            "draft_tokens": config.speculative_num_draft_tokens,
            "acceptance_length": round(stats.acceptance_length, 3),
            "acceptance_rate": round(stats.acceptance_rate, 3),
            **stats.as_dict(),
        }
    _emit(result, args.output)
    return 0


def _check_vocab_fits(requests: list[workloads.BenchRequest], model: str, vocab: int) -> None:
    top = max(max(r.prompt_ids) for r in requests)
    if top >= vocab:
        _refuse(
            "offline",
            f"the standard workload's prompts hold token ids up to {top}, but {model} has a vocabulary "
            f"of {vocab}; use a model with a larger one (--shape qwen3-0.6b or llama-3.1-8b builds one)",
        )


def _grammar(args: argparse.Namespace) -> int:
    from minisgl_core.bench.grammar import host_step_bench

    check_grammar_threads(args.grammar_threads)
    logits = args.rows * args.vocab_size  # (the float32 logits each step draws, a mask's rows too)
    if logits > MAX_GRAMMAR_BENCH_LOGITS:  # (--rows 99999999999999999999 ran until killed)
        raise ConfigError(
            f"--rows {args.rows} x --vocab-size {args.vocab_size}: each step would draw {logits:,} logits, "
            f"more than the {MAX_GRAMMAR_BENCH_LOGITS:,} (4 GiB) a bench allocates; lower --rows or --vocab-size"
        )
    from minisgl_core.plugins import Plugins

    plugins = Plugins.load()
    installed = plugins.names("grammars")
    if args.grammar_backend not in installed:  # (a traceback from the backend's loader before)
        raise ConfigError(
            f"unknown --grammar-backend {args.grammar_backend!r}; installed: {', '.join(installed)}"
        )
    try:
        result = host_step_bench(
            args.grammar_backend, rows=args.rows, steps=args.steps, warm_steps=args.warm_steps,
            vocab_size=args.vocab_size, fill_threads=args.grammar_threads, schema=args.grammar_schema,
            max_tokens=args.max_tokens, cache=Path(args.model_cache), plugins=plugins,
        )  # fmt: skip
    except GrammarError as exc:
        return _schema_refused("grammar", args.grammar_schema, exc)
    _emit({**_meta(args), **result}, args.output)
    return 0


def _schema_refused(bench: str, source: str, exc: GrammarError) -> int:
    """A --grammar-schema the grammar backend refuses (JSON, but not a schema it can compile):
    one line as argparse says a bad argument, not the backend's traceback. Only the backend can
    tell, so this comes once it is built (for bench offline, from the model's tokenizer before
    the weights load)."""
    print(f"minisgl bench {bench}: error: argument --grammar-schema: {source}: {exc}", file=sys.stderr)
    return 2


def _cpu(args: argparse.Namespace) -> int:
    import torch

    from minisgl_core.bench.cpu import (
        CHATS,
        TransformersRunner,
        chat_prompts,
        markdown_table,
        memory_bandwidth,
        run_cpu_bench,
    )
    from minisgl_core.config_args import ENGINE_FIELDS, engine_config_from_args, engine_default
    from minisgl_core.llm import LLM
    from minisgl_core.setting_names import flag

    torch.set_num_threads(args.threads)
    # the flags given (before the device's default is filled in): an --engine-arg contradicting
    # one of them won without a word, and the JSON named only the --engine-arg
    given = {
        name: value
        for name in ENGINE_FIELDS
        if (value := getattr(args, name)) is not None and value != engine_default(name)
    }
    if args.device == "auto":
        args.device = "cpu"
    batch_sizes = args.batch_sizes
    config = engine_config_from_args(args)
    fields = {k: v for k, v in vars(config).items() if k != "model"}
    for key, value in (_engine_arg(text, fields) for text in args.engine_arg):
        if key in given and given[key] != value:
            raise ConfigError(
                f"--engine-arg {key}={short_repr(value)} contradicts {flag(key)} {given[key]}: give one of them"
            )
        fields[key] = value
    # the --engine-arg values checked as the engine checks them, before they are compared below
    # (max_running_requests=abc was a TypeError traceback there, -1 "more than -1")
    checked = dataclasses.replace(config, **fields)
    if checked.tp_size != 1:  # (LLM's own refusal was a traceback)
        raise ConfigError(f"bench cpu runs the offline LLM in one process: --tp 1, not {checked.tp_size}")
    largest, running = max(batch_sizes), checked.max_running_requests
    # (ours ran a larger one in waves, transformers in one batch; a huge one built prompts for ever)
    if largest > running:
        raise ConfigError(
            f"--batch-sizes {largest}: more than --max-running-requests {running}, the requests the engine "
            "runs at once (a larger batch is not timed as one); lower it or raise --max-running-requests"
        )
    llm = LLM(config.model, disable_plugins=args.disable_plugin, **fields)
    try:  # the prompts are the chat template's: known once the tokenizer is
        # (run_cpu_bench's warm-up: two prompts, 4 new tokens; then up to the largest batch's)
        warm = max(map(len, chat_prompts(llm.tokenizer, 2))) + 4
        timed = (
            max(map(len, chat_prompts(llm.tokenizer, min(len(CHATS), max(batch_sizes)))))
            + args.max_new_tokens
        )
        lower = "--max-new-tokens" if timed > warm else None
        _check_limits_fit("cpu", max(warm, timed), llm, fields["max_context_len"], lower=lower)
    except ConfigError:
        llm.close()
        raise
    theirs = None if args.no_transformers else TransformersRunner(config.model, set(llm.engine.eos_ids))
    result = run_cpu_bench(
        llm,
        theirs,
        batch_sizes=batch_sizes,
        new_tokens=args.max_new_tokens,
        rounds=args.rounds,
        bandwidth=memory_bandwidth(),
    )
    # every engine option that is not the default, whether a flag or an --engine-arg gave it
    options = {k: v if isinstance(v, (str, int, float, bool)) else repr(v) for k, v in fields.items()
               if k in ENGINE_FIELDS and v != engine_default(k) and v is not None}  # fmt: skip
    result = {**_meta(args), "bench": "cpu", "model": config.model, "engine_args": args.engine_arg,
              "engine_options": options, "cpu": _cpu_name(), **result}  # fmt: skip
    print(markdown_table(result))
    _emit(result, args.output)
    llm.close()
    return 0


def _engine_arg(text: str, known: dict[str, Any]) -> tuple[str, Any]:
    import ast

    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ConfigError(f"--engine-arg takes KEY=VALUE, got {text!r}")
    key = key.replace("-", "_")
    if key not in known:
        raise ConfigError(f"--engine-arg {key}: not an LLM option; known: {', '.join(sorted(known))}")
    try:
        return key, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return key, value


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _serve(args: argparse.Namespace) -> int:
    from minisgl_core.bench.serve import (
        BenchError,
        check_context,
        fit_vocab,
        for_sweep_point,
        prompt_texts,
        run_load,
        served_model,
    )
    from minisgl_core.config import check_api_key

    if args.server == "mini-sglang" and not args.tokenizer:
        _refuse(
            "serve",
            "mini-sglang's server takes text prompts only: add --tokenizer DIR (the served model's folder)",
        )

    if args.workload == "standard":
        _check_workload_size("serve", args.num_requests * workloads.STANDARD_MAX_PROMPT, "--num-requests")
        requests = workloads.standard_offline(args.num_requests, seed=args.seed)
    else:
        _check_workload_size(
            "serve",
            args.groups * args.prompts_per_group * (args.prefix_len + args.question_len),
            "--groups, --prompts-per-group, --prefix-len or --question-len",
        )
        requests = workloads.shared_prefix(
            args.groups,
            args.prompts_per_group,
            args.prefix_len,
            args.question_len,
            args.output_len,
            seed=args.seed,
        )
    _check_arrival_span(len(requests), args.request_rate or [])
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not one log line per request
    try:
        check_api_key(args.api_key)
    except ConfigError as exc:
        _refuse("serve", str(exc))
    try:
        served = served_model(args.url, args.api_key)
        check_context(requests, served)
    except BenchError as exc:
        raise SystemExit(f"minisgl bench serve: {exc}") from None
    model = args.model or served.name
    requests = fit_vocab(requests, served.vocab_size)
    sweep: list[tuple[int | None, float | None]] = []
    sweep += [(c, None) for c in args.concurrency or []]
    sweep += [(None, r) for r in args.request_rate or []]
    for point, (concurrency, rate) in enumerate(sweep or [(None, None)]):
        # each point on prompts the server has not cached: the first point's prefix-cache hits
        # would otherwise be the later points' too, whatever the workload's own sharing
        point_requests = for_sweep_point(requests, point, served.vocab_size)
        try:
            texts = prompt_texts(point_requests, args.tokenizer) if args.tokenizer else None
        except BenchError as exc:
            raise SystemExit(f"minisgl bench serve: {exc}") from None
        try:
            result = asyncio.run(
                run_load(
                    args.url,
                    model,
                    point_requests,
                    concurrency=concurrency,
                    request_rate=rate,
                    api_key=args.api_key,
                    trace=args.trace,
                    server=args.server,
                    texts=texts,
                )  # fmt: skip
            )
        except BenchError as exc:  # a request the server refused (e.g. a --model it does not serve)
            raise SystemExit(f"minisgl bench serve: {exc}") from None
        extra = {}
        if args.workload == "shared-prefix":
            extra["ideal_hit_rate"] = round(
                workloads.ideal_hit_rate(
                    args.groups, args.prompts_per_group, args.prefix_len, args.question_len
                ),
                4,
            )
        if point:
            extra["prompt_ids_shifted_by"] = point  # (for_sweep_point)
        _emit({**_meta(args), "bench": "serve", "workload": args.workload, "model": model, **result, **extra},
              args.output)  # fmt: skip
    return 0


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


#: requests of the standard workload a CPU runs in a few minutes (the default, 256, takes hours)
CPU_REQUESTS = 8


def _warn_if_long_on_cpu(args: argparse.Namespace) -> None:
    """bench offline's workload is a GPU's: on a CPU it ran for many minutes without a word."""
    on_cpu = args.device.startswith("cpu") or (args.device == "auto" and not _cuda())
    if on_cpu and args.num_requests > CPU_REQUESTS:
        print(
            f"minisgl bench offline: warning: a GPU benchmark ({args.num_requests} requests of up to "
            f"1,024 output tokens) takes long on a CPU: add --num-requests {CPU_REQUESTS} for a short "
            "run, or measure the CPU with `minisgl bench cpu` (ours against transformers)",
            file=sys.stderr,
            flush=True,
        )


#: seconds between bench offline's progress lines on stderr (a CPU run said nothing for minutes)
PROGRESS_EVERY = 30.0

#: the most logits bench grammar's step may draw (float32, rows x vocabulary): 27x its default's
MAX_GRAMMAR_BENCH_LOGITS = 1 << 30

#: the most prompt tokens a bench workload may hold (15x the shared-prefix default's 2.2M): a
#: larger one took minutes and gigabytes to build before anything was sent
MAX_BENCH_PROMPT_TOKENS = 1 << 25


def _check_workload_size(bench: str, prompt_tokens: int, flags: str) -> None:
    if prompt_tokens > MAX_BENCH_PROMPT_TOKENS:
        _refuse(
            bench,
            f"the workload would hold up to {prompt_tokens:,} prompt tokens, more than the "
            f"{MAX_BENCH_PROMPT_TOKENS:,} a bench builds; lower {flags}",
        )


def _refuse(bench: str, message: str) -> NoReturn:
    """Flags refused once parsed, as argparse refuses them: one line and exit code 2 (a usage
    error; ``SystemExit(message)`` exited 1, as a run that failed does)."""
    print(f"minisgl bench {bench}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


#: the longest a --request-rate sweep point's arrivals may take on average: a rate of 1e-300 was
#: taken, and the bench then waited between two requests until killed
MAX_ARRIVAL_SECONDS = 24 * 3600


def _check_arrival_span(requests: int, rates: list[float]) -> None:
    """Each --request-rate sends ``requests`` with exponential gaps of mean 1/rate between them."""
    for rate in rates:
        span = (requests - 1) / rate
        if span > MAX_ARRIVAL_SECONDS:
            least = (requests - 1) / MAX_ARRIVAL_SECONDS
            places = 2 - math.floor(math.log10(least))  # (three significant digits, rounded up)
            raise ConfigError(
                f"--request-rate {rate:g}: the {requests} requests would take {span / 3600:,.3g} hours to "
                f"arrive on average, more than the {MAX_ARRIVAL_SECONDS // 3600} hours a bench waits; give "
                f"at least {math.ceil(least * 10**places) / 10**places:g} requests/s (or fewer requests)"
            )


def _check_requests_fit(
    bench: str, longest: int, max_context_len: int | None, kv_tokens: int | None, *, models_context: bool = False,
    lower: str | None = None,
) -> None:  # fmt: skip
    """The bench's longest request (prompt and output tokens) against the context length and the KV
    pool, where known (None: not yet): one past them was ContextLengthExceeded's traceback from the
    first generate, once the model had loaded. ``lower``: the flag that shortens the requests."""
    what = f"bench {bench}'s requests take up to {longest} tokens (prompt and output)"
    instead = f" or lower {lower}" if lower else ""
    if max_context_len is not None and longest > max_context_len:
        if models_context:  # (a --max-context-len past it is cut to it)
            fix = f"lower {lower}" if lower else "use a model with a longer one"
            raise ConfigError(f"{what}, more than the model's context length {max_context_len}; {fix}")
        raise ConfigError(
            f"{what}, more than --max-context-len {max_context_len}; raise it to {longest}{instead}"
        )
    if kv_tokens is not None and longest > kv_tokens:
        raise ConfigError(
            f"{what}, more than the KV pool's {kv_tokens}; raise --num-kv-tokens to {longest}{instead}"
        )


def _check_limits_fit(
    bench: str, longest: int, llm: Any, given_context_len: int | None, **kwargs: Any
) -> None:
    """:func:`_check_requests_fit` against the limits the engine resolved."""
    limits = llm.engine.limits
    models_context = given_context_len is None or given_context_len > limits.max_context_len
    _check_requests_fit(
        bench,
        longest,
        limits.max_context_len,
        limits.kv_capacity_tokens,
        models_context=models_context,
        **kwargs,
    )


def _writable(text: str) -> str:
    """A file a bench writes when its run is over, checked before the run (a missing directory
    failed with a traceback after minutes of measuring, the result lost)."""
    if not text.strip():  # (it was " is a directory, not a file": the working directory's name)
        raise argparse.ArgumentTypeError("is empty: give the file to write, or leave the flag out")
    try:
        return _check_writable(text)
    except OSError as e:
        raise _unlooked_up(text, e) from None


def _unlooked_up(text: str, error: OSError) -> argparse.ArgumentTypeError:
    """A path the file system will not look up (a name too long: ENAMETOOLONG, which pathlib's
    ``exists`` and ``is_dir`` raise where they answer False for a missing one), as one line: it
    was os.stat's traceback from bench's --output, --profile, --trace and --model-cache."""
    return argparse.ArgumentTypeError(f"cannot write {cut(text)}: {(error.strerror or str(error)).lower()}")


def _check_writable(text: str) -> str:
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory, not a file")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write {text}: no directory {folder}")
    if path.exists():
        _check_opens_for_append(text, path)
    else:
        _check_can_create_in(text, folder)
    return text


#: kernel interfaces: their files look regular, open for root, and fail (or act) on a write
_KERNEL_FILE_SYSTEMS = (Path("/proc"), Path("/sys"))


def _check_opens_for_append(text: str, path: Path) -> None:
    """An existing ``path`` opens for appending, tried (``os.access`` says yes to root on any file,
    /proc's and /sys's included, whose write then failed after the run)."""
    if stat.S_ISREG(path.stat().st_mode) and any(
        path.resolve().is_relative_to(root) for root in _KERNEL_FILE_SYSTEMS
    ):
        raise argparse.ArgumentTypeError(
            f"cannot write {text}: a kernel interface file, not a file for results"
        )
    try:  # non-blocking: a FIFO with no reader fails here instead of hanging the bench
        os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK))
    except OSError as e:
        raise argparse.ArgumentTypeError(f"cannot write {text}: {e.strerror.lower()}") from None


def _check_can_create_in(text: str, folder: Path) -> None:
    """A file can be made in ``folder``: tried with a temporary one, removed at once."""
    try:
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as e:
        raise argparse.ArgumentTypeError(f"cannot write {text}: {e.strerror.lower()}") from None


def _model_cache(text: str) -> str:
    """A folder the bench builds its models or tokenizers in, made if missing, in a directory that
    exists as :func:`_writable` asks (a file there was a NotADirectoryError traceback, a typo made
    every folder up to /; an empty one, the working directory, took --shape's gigabytes)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty: give the folder to build in, or leave the flag out")
    try:
        return _check_model_cache(text)
    except OSError as e:
        raise _unlooked_up(text, e) from None


def _check_model_cache(text: str) -> str:
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is not a directory")
    folder = path.parent if str(path.parent) else Path(".")
    if not path.exists() and not folder.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write {text}: no directory {folder}")
    _check_can_create_in(text, path if path.exists() else folder)
    return text


def _tokenizer(text: str) -> str:
    """``bench serve --tokenizer``: an empty one was taken as the flag left out (token ids sent)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            "is empty: give the served model's folder or .gguf file, or leave the flag out to send token ids"
        )
    return text


def _server_url(text: str) -> str:
    """The server's base URL, http:// or https:// (``localhost:8000`` without a scheme was "cannot
    reach the server ... start it first" while the server ran), as :func:`base_url` spells it."""
    scheme, sep, rest = text.partition("://")
    if not sep:
        raise argparse.ArgumentTypeError(f"needs a scheme: http://{text}")
    if scheme.lower() not in ("http", "https"):
        raise argparse.ArgumentTypeError(
            f"must be an http:// or https:// URL, not {scheme}://: http://{rest}"
        )
    if not rest.split("/", 1)[0]:
        raise argparse.ArgumentTypeError(f"names no host, got {text!r}: e.g. http://127.0.0.1:8000")
    # a host or port no client can use (http://[::1, http://127.0.0.1:abc) was httpx's InvalidURL
    # traceback, one out of range (http://127.0.0.1:99999) "cannot reach the server ... start it
    # first" while it ran: checked as `shell --url` checks them
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(text)
        port = parts.port  # (a ValueError where it is out of range, or no number)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"is not a URL ({exc}), got {text!r}: e.g. http://127.0.0.1:8000"
        ) from None
    if not parts.hostname:
        raise argparse.ArgumentTypeError(f"names no host, got {text!r}: e.g. http://127.0.0.1:8000")
    if port == 0:
        raise argparse.ArgumentTypeError(f"the port must be a number from 1 to 65535, got {text!r}")
    from minisgl_core.server.cli import base_url, host_problem

    if (problem := host_problem(parts.hostname)) is not None:
        raise argparse.ArgumentTypeError(f"{problem}, got {cut(text)!r}")
    return base_url(text)


def _positive_ints(text: str) -> list[int]:
    try:
        return [_positive_int(c) for c in text.split(",")]
    except (ValueError, argparse.ArgumentTypeError):
        raise argparse.ArgumentTypeError(f"must be integers >= 1 separated by commas, got {text!r}") from None


def _temperature(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def _schema_source(text: str) -> str:
    """``builtin``, or a readable file holding JSON (checked before any model loads)."""
    if text == "builtin":
        return text
    if not text.strip():  # (it was "cannot read : Is a directory")
        raise argparse.ArgumentTypeError("is empty: give a JSON schema file, or builtin")
    try:
        json.loads(Path(text).read_text())
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot read {text}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text} is not JSON: {exc}") from None
    return text


def _rate_sweep(text: str) -> list[float]:
    try:
        rates = [float(r) for r in text.split(",")]
    except ValueError:
        rates = []
    if not rates or not all(math.isfinite(r) and r > 0 for r in rates):
        raise argparse.ArgumentTypeError(
            f"must be requests/s > 0 separated by commas (e.g. 4,16), got {text!r}"
        )
    return rates


def _vocab_size(text: str) -> int:
    """``bench grammar``'s vocabulary: at least its tokenizer's (1 was a traceback from the grammar
    backend, which then had no token to begin any text with)."""
    try:
        value = _positive_int(text)
    except (ValueError, argparse.ArgumentTypeError):
        value = None
    if value is None or value < TRAINED_TOKENS:
        raise argparse.ArgumentTypeError(
            f"must be an integer >= {TRAINED_TOKENS} (the tokens of the tokenizer the bench trains), got {text}"
        )
    return value


#: the longest array a JSON schema's minItems may ask for (xgrammar's limit, a C int's)
MAX_SCHEMA_ITEMS = 2**31 - 1


def _schema_length(text: str) -> int:
    """``bench grammar --max-tokens``, the builtin schema's minItems: past 2**31 - 1 the grammar
    backend refused the schema, the error naming --grammar-schema."""
    try:
        value = _positive_int(text)
    except (ValueError, argparse.ArgumentTypeError):
        value = None
    if value is None or value > MAX_SCHEMA_ITEMS:
        raise argparse.ArgumentTypeError(
            f"must be an integer from 1 to {MAX_SCHEMA_ITEMS} (the builtin schema's minItems), got {cut(text)}"
        )
    return value


#: the most steps bench grammar walks, timed or warm-up, each (its default: 24): 10**20 ran until
#: killed, and at its default rows a step takes milliseconds to tens of them
MAX_GRAMMAR_BENCH_STEPS = 100_000
#: the most alternating runs per batch size bench cpu makes (its default: 3): 10**20 ran until
#: killed, and a run takes seconds to minutes on a CPU
MAX_CPU_BENCH_ROUNDS = 1_000


def _int_range(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer from ``low`` to ``high``, anything else refused naming the range
    (one without a bound was taken, up to 10**20, and the bench then ran until killed)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be an integer from {low} to {high:,}, got {cut(text)}")
        return value

    return parse


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {value}")
    return value


def _cpu_threads(text: str) -> int:
    """``bench cpu --threads``: 1 to the machine's CPUs (past 2**31 torch.set_num_threads raised
    its ValueError traceback; short of that, threads that only take turns on the cores)."""
    cpus = os.cpu_count() or 1
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= cpus:
        raise argparse.ArgumentTypeError(f"must be 1 to {cpus} (this machine's CPUs), got {text}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {value}")
    return value
