"""The ``minisgl`` command: serve, shell, generate, plugins, bench."""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import select
import sys
from typing import Any, NoReturn

from minisgl_core import environment
from minisgl_core.checkpoint.resolve import ModelNotFound
from minisgl_core.config import ConfigError
from minisgl_core.plugins import NOT_LOADED, PluginError, Plugins


def _cmd_plugins(args: argparse.Namespace) -> int:
    plugins = Plugins.load(disable=args.disable_plugin)
    plugins.check_classes()
    # serve's and shell's parsers, as a start builds them: a plugin whose options are left out
    # there (one raised, or takes a core flag) is listed so
    build_parser(plugins)
    listing = plugins.listing()
    if args.json:
        print(json.dumps(listing, indent=2))
    else:
        print(plugins.format_table())
    broken = [p["name"] for p in listing if p["status"] in NOT_LOADED]
    if args.check and broken:
        print(f"minisgl: error: not loaded: {', '.join(broken)} (see the status column)", file=sys.stderr)
        return 1
    return 0


def _cmd_generate(args: argparse.Namespace) -> int:
    from minisgl_core.config_args import engine_config_from_args
    from minisgl_core.llm import LLM
    from minisgl_core.sampling import LONE_SURROGATE, SamplingParams

    config = engine_config_from_args(args)
    if config.tp_size != 1:
        raise ConfigError(
            f"tp_size {config.tp_size}: minisgl generate runs one process (tp_size 1); "
            "use `minisgl serve --tp N` for tensor parallelism",
            "tp_size",
        )
    try:  # checked before the model loads
        params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens)
    except ValueError as exc:  # the message names the field: --temperature, --max-tokens
        raise ConfigError(str(exc), *(f for f in ("temperature", "max_tokens") if f in str(exc))) from None
    if not all(args.prompt):
        raise ConfigError("a prompt is empty: give each prompt some text")
    for i, prompt in enumerate(args.prompt):
        # a byte that is not UTF-8 comes through argv as a lone surrogate (surrogateescape): the
        # LLM said so once the model had loaded, in words about UTF-16 the user never typed
        if (bad := LONE_SURROGATE.search(prompt)) is not None:
            which = f"prompt {i + 1}" if len(args.prompt) > 1 else "the prompt"
            raise ConfigError(
                f"{which} is not valid UTF-8 text (a byte 0x{ord(bad.group()) & 0xFF:02x} at character "
                f"{bad.start()}): pass text in UTF-8"
            )
    # (the model checked above; the engine's errors name the flags, as the checks did)
    llm = LLM.from_config(config, disable_plugins=args.disable_plugin, spelling="flag")
    # the other sampling fields take the model's defaults (--generation-config): they were OpenAI's
    params = llm.sampling_params(temperature=params.temperature, max_tokens=params.max_tokens)
    try:
        outputs = llm.generate(args.prompt, params)
    except ValueError as exc:  # a prompt the model cannot take (e.g. longer than its context)
        raise ConfigError(str(exc), "max_tokens") from None
    for out in outputs:
        _print_json({"text": out.text, "token_ids": out.token_ids, "finish_reason": out.finish_reason})
    return 0


def _print_json(value: dict[str, Any]) -> None:
    """One JSON line with its characters as they are ("日本", not "\\u65e5\\u672c"); as escapes where
    stdout cannot encode them (PYTHONIOENCODING=ascii, a Windows console) rather than a traceback."""
    try:
        print(json.dumps(value, ensure_ascii=False))
    except UnicodeEncodeError:  # raised before anything is written: the line is encoded whole
        print(json.dumps(value))


class _Parser(argparse.ArgumentParser):
    """No abbreviated flags: argparse took ``generate --n 2`` for ``--num-kv-tokens 2`` (and any
    prefix for whichever flag it starts); a flag not spelled out is an error naming it. The
    subcommands' parsers are of this class too (argparse makes them with the parent's class)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        """argparse's error line alone, as every other refusal of the command line is one line
        (argparse printed the usage block first: 14-38 lines above the one that says what is wrong);
        an SGLang or vLLM flag among the unrecognized arguments gets minisgl's flag for it, and a
        missing subcommand the names to choose from (the usage block listed them; the line alone
        said "required: command", or "bench_kind"); a prompt taken for a flag says how to pass it."""
        prefix = "unrecognized arguments: "
        if message.startswith(prefix):
            arguments = message[len(prefix) :].split()
            message += "".join(f"; {hint}" for hint in foreign_flag_hints(arguments))
            notes = getattr(self, "plugin_flag_notes", {})
            message += "".join(f"; {hint}" for hint in plugin_flag_hints(arguments, notes))
        required = "the following arguments are required: "
        if message.startswith(required):
            missing = message[len(required) :].split(", ")
            for action in self._actions:
                if isinstance(action, argparse._SubParsersAction) and action.dest in missing:
                    message += f" (one of: {', '.join(action.choices)})"
        if any(action.dest == "prompt" for action in self._actions) and (
            "prompt" in message.removeprefix(required).split(", ") or "ignored explicit argument" in message
        ):  # ("generate -hello" was "argument -h/--help: ignored explicit argument 'ello'")
            message += f"; a prompt that starts with '-' goes after '--', as in {self.prog} -- '-hello'"
        self.exit(2, f"{self.prog}: error: {message}\n")


#: SGLang's and vLLM's server flags with a minisgl equivalent: flag -> (whose, minisgl's). vLLM's
#: flags that are also its ``LLM(...)`` keywords come from ``setting_names.VLLM_KEYWORDS``.
_FOREIGN_FLAGS = {
    "--chunked-prefill-size": ("SGLang", "--max-prefill-tokens"),
    "--context-length": ("SGLang", "--max-context-len"),
    "--max-model-len": ("vLLM", "--max-context-len"),
    "--max-total-tokens": ("SGLang", "--num-kv-tokens"),
    "--mem-fraction-static": ("SGLang", "--kv-memory-fraction (a share of the GPU memory left once the weights are loaded)"),
    "--gpu-memory-utilization": ("vLLM", "--kv-memory-fraction (a share of the GPU memory left once the weights are loaded)"),
    "--attention-backend": ("SGLang", "--attn"),
    "--tp-size": ("SGLang", "--tp"),
    "-tp": ("vLLM", "--tp"),
    "--model-path": ("SGLang", "--model"),
    "--random-seed": ("SGLang", "--seed"),
    "--schedule-policy": ("SGLang", "--policy"),
    "--disable-radix-cache": ("SGLang", "--cache naive"),
    "--disable-cuda-graph": ("SGLang", "--cuda-graph-max-bs 0"),
    "--block-size": ("vLLM", "--page-size"),
    "--uvicorn-log-level": ("vLLM", "--log-level"),
    "--enable-auto-tool-choice": ("vLLM", "--tool-call-parser NAME alone (it turns on tool_choice 'auto')"),
}  # fmt: skip


def foreign_flag_hints(arguments: list[str]) -> list[str]:
    """For each SGLang or vLLM flag among ``arguments`` (``--flag`` or ``--flag=VALUE``, dashes or
    underscores) that minisgl spells otherwise, a line naming minisgl's: "--chunked-prefill-size is
    SGLang's; minisgl's is --max-prefill-tokens"."""
    from minisgl_core.setting_names import NOT_NEEDED_KEYWORDS, VLLM_KEYWORDS

    known = dict(_FOREIGN_FLAGS)
    for keyword, setting in VLLM_KEYWORDS.items():
        known["--" + keyword.replace("_", "-")] = ("vLLM", setting.hint("flag"))
    hints = []
    for argument in arguments:
        name = argument.split("=", 1)[0]
        if name.startswith("--"):
            name = name.replace("_", "-")
        keyword = name.lstrip("-").replace("-", "_")
        if name in known:
            whose, instead = known[name]
            hints.append(f"{name} is {whose}'s; minisgl's is {instead}")
        elif keyword in NOT_NEEDED_KEYWORDS:
            hints.append(f"{name} is vLLM's and SGLang's: {NOT_NEEDED_KEYWORDS[keyword]}")
    return list(dict.fromkeys(hints))


def plugin_flag_notes(plugins: Plugins) -> dict[str, str]:
    """``--NAME-`` -> why plugin NAME has no options on this command line: its
    ``minisgl_add_cli_options`` raised or took a flag already taken, or the plugin did not load.
    (A flag of such a plugin was "unrecognized arguments: --x-max-wait 5" and nothing more.)"""
    notes = {}
    for info in plugins.infos:
        who = f"plugin {info.name!r} ({info.distribution} {info.version})"
        if info.options_left_out is not None:
            notes[f"--{info.name}-"] = f"{who}: {info.options_left_out[1]}"
        elif info.status == "disabled":  # (by the user: the option was meant, the plugin left out)
            notes[f"--{info.name}-"] = (
                f"{who}: it is disabled ({info.reason}), so its options would do nothing; drop them, "
                "or enable the plugin"
            )
        elif info.status not in ("ok", "unavailable"):
            why = f" ({info.reason})" if info.reason else ""
            notes[f"--{info.name}-"] = f"{who}: it is {info.status}{why}, so its options are not available"
    return notes


def plugin_flag_hints(arguments: list[str], notes: dict[str, str]) -> list[str]:
    """For each flag among ``arguments`` named like a plugin whose options are not on the command
    line (``--NAME-...``, the namespace plugins.md asks for), what :func:`plugin_flag_notes` says."""
    hints = []
    for argument in arguments:
        flag = argument.split("=", 1)[0].replace("_", "-")
        matches = [prefix for prefix in notes if flag.startswith(prefix.replace("_", "-"))]
        if matches:
            prefix = max(matches, key=len)  # (plugins "x" and "x-y": --x-y-z is x-y's)
            hints.append(f"{argument.split('=', 1)[0]} looks like an option of {notes[prefix]}")
    return list(dict.fromkeys(hints))


_LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


class _FromEnvironment(str):
    """--log-level's default as MINISGL_LOG_LEVEL spells it: a bad one is named as the variable's."""


def _log_level(value: str) -> str:
    """A logging level name, any case (argparse applies this to the environment's default too)."""
    if value.lower() not in _LOG_LEVELS:
        source = "its default from MINISGL_LOG_LEVEL " if isinstance(value, _FromEnvironment) else ""
        raise argparse.ArgumentTypeError(f"{source}must be one of {', '.join(_LOG_LEVELS)}, got {value!r}")
    return value.lower()


def build_parser(plugins: Plugins | None = None) -> argparse.ArgumentParser:
    from minisgl_core.config_args import add_engine_args

    if plugins is None:
        try:
            plugins = Plugins.load()
        except Exception as exc:  # noqa: BLE001 - the CLI works without its plugins' help
            logging.getLogger(__name__).warning("could not load plugins for the command line's help: %s", exc)
    parser = _Parser(prog="minisgl", description="minisgl: a small plugin-based LLM serving engine")
    _add_log_level(parser, default=_FromEnvironment(environment.get("MINISGL_LOG_LEVEL", "info")))
    from minisgl_core import __version__
    from minisgl_core.api import API_VERSION

    parser.add_argument(
        "--version", action="version", version=f"minisgl {__version__} (plugin API {API_VERSION})"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("plugins", help="list discovered plugins")
    p.add_argument("--json", action="store_true", help="print the list as JSON (default: a table)")
    p.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when a plugin did not load for a fault of its own (failed, incompatible, "
        "conflict; also a plugin whose CLI options are left out): for a script, e.g. a plugin's CI "
        "after installing it",
    )
    p.add_argument(
        "--disable-plugin",
        action="append",
        default=[],
        metavar="NAME",
        help="list a plugin as disabled, as serve's --disable-plugin would leave it (repeatable)",
    )
    p.set_defaults(func=_cmd_plugins)

    p = sub.add_parser("generate", help="generate offline for prompts given on the command line")
    add_engine_args(p)
    p.add_argument(
        "prompt",
        nargs="+",
        help="one or more prompts; one JSON line is printed for each (sampling fields other than "
        "--temperature and --max-tokens take the model's defaults: --generation-config)",
    )
    p.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="sampling temperature; 0 = greedy (default: %(default)s)",
    )
    p.add_argument(
        "--max-tokens", type=int, default=32, help="most tokens generated per prompt (default: %(default)s)"
    )
    p.set_defaults(func=_cmd_generate)

    try:
        from minisgl_core.server.cli import add_server_commands
    except ImportError:  # the server package is optional while it is being built
        add_server_commands = None
    if add_server_commands is not None:
        add_server_commands(sub, plugins)
    try:
        from minisgl_core.bench.cli import add_bench_command
    except ImportError:
        add_bench_command = None
    if add_bench_command is not None:
        add_bench_command(sub)
    _log_level_after_subcommands(parser)
    if plugins is not None:
        _name_installed_choices(parser, plugins)
        # (read by _Parser.error: argparse reports a subcommand's unknown flags on this parser)
        parser.plugin_flag_notes = plugin_flag_notes(plugins)  # type: ignore[attr-defined]
    return parser


#: the options that select a plugin, by dest, and the kind of plugin each selects
_PLUGIN_OPTIONS = {
    "attn": "attention",
    "cache": "caches",
    "policy": "policies",
    "quantization": "quantization",
    "grammar_backend": "grammars",
    "tool_call_parser": "tool_parsers",
    "reasoning_parser": "reasoning_parsers",
}


def _name_installed_choices(parser: argparse.ArgumentParser, plugins: Plugins) -> None:
    """Each plugin-selecting option's help ends with the names installed now, third parties'
    included (``--policy``'s said only "scheduling policy plugin")."""
    for action in parser._actions:
        kind = _PLUGIN_OPTIONS.get(action.dest)
        if kind is not None and action.option_strings and action.help:
            names = plugins.names(kind)
            action.help += f" (installed: {', '.join(names)})" if names else " (none installed)"
        if isinstance(action, argparse._SubParsersAction):
            for subparser in {id(p): p for p in action.choices.values()}.values():
                _name_installed_choices(subparser, plugins)


def _add_log_level(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument(
        "--log-level",
        type=_log_level,
        default=default,
        help="debug, info, warning, error or critical (default: env MINISGL_LOG_LEVEL, else info)",
    )


def _log_level_after_subcommands(parser: argparse.ArgumentParser) -> None:
    """``--log-level`` after any subcommand too (``minisgl serve --log-level debug`` was refused):
    with no default there, so that one given before the subcommand, or the environment's, stands."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for subparser in {id(p): p for p in action.choices.values()}.values():  # (aliases: once)
                _add_log_level(subparser, default=argparse.SUPPRESS)
                _log_level_after_subcommands(subparser)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "plugin_dests", None) and args.disable_plugin:
        _refuse_disabled_plugins_options(argv, args.disable_plugin)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from minisgl_core.checkpoint.generation_defaults import GenerationConfigError
    from minisgl_core.checkpoint.path_check import ModelPathError
    from minisgl_core.config_args import cli_message
    from minisgl_core.engine.plugin_failures import PluginFailure

    # a setting or an input the user can fix: one line and exit code 2, as argparse's own errors
    try:
        status = int(args.func(args) or 0)
        sys.stdout.flush()  # a write error here, not in the interpreter's own flush at exit
        return status
    except KeyboardInterrupt:
        # Ctrl-C (`generate`, or any command while it loads): the user knows why, as a shell
        # does; 130 is 128 + SIGINT. `serve` and `shell` handle it themselves.
        return 130
    except BrokenPipeError:
        if not _stdout_closed():
            raise
        # its reader has gone (`minisgl plugins --json | head -1`): quietly, as CPython's docs on
        # SIGPIPE recommend, with stdout at devnull so that the flush at exit does not fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except ConfigError as exc:
        print(f"minisgl: error: {cli_message(exc)}", file=sys.stderr)
        return 2
    except (
        PluginError,
        ModelNotFound,
        ModelPathError,
        GenerationConfigError,
        environment.CacheDirError,
    ) as exc:
        print(f"minisgl: error: {exc}", file=sys.stderr)
        return 2
    except PluginFailure as exc:
        # a plugin raised in a step: its bug, named in one line; its traceback for its author
        logging.getLogger(__name__).debug("the plugin's exception", exc_info=exc)
        print(f"minisgl: error: {exc} (its traceback: --log-level debug)", file=sys.stderr)
        return 1
    except OSError as exc:  # the cache (fetching the default model, building the demo one), a full disk
        problem = environment.cache_dir_error(exc)
        if problem is None and exc.errno in (errno.ENOSPC, errno.EDQUOT):  # stdout or a file's
            where = f" ({exc.filename})" if exc.filename else ""
            print(
                f"minisgl: error: cannot write{where}: {exc.strerror}; free some space or write elsewhere",
                file=sys.stderr,
            )
            return 1
        if problem is None:
            raise
        print(f"minisgl: error: {problem}", file=sys.stderr)
        return 2


def _refuse_disabled_plugins_options(argv: list[str] | None, disable: list[str]) -> None:
    """The command line parsed again without the plugins ``--disable-plugin`` names: the parser
    is built before the flags are read, so it held their options, and ``serve --disable-plugin x
    --x-level 1`` was taken with the option doing nothing. Now a flag of a disabled plugin is the
    usage error (exit 2) it is under ``MINISGL_DISABLE_PLUGINS=x``, which says the plugin is
    disabled. (A name no plugin has is left to the command, whose error names it.)"""
    from minisgl_core.plugins import UnknownPluginName

    try:
        plugins = Plugins.load(disable=disable)
    except UnknownPluginName:
        return
    build_parser(plugins).parse_args(argv)


def _stdout_closed() -> bool:
    """Whether stdout is a pipe or socket whose reader has gone (it polls as an error), so that a
    BrokenPipeError from elsewhere (a worker's pipe) keeps its traceback."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll (Windows) or no descriptor (captured)
        return False


if __name__ == "__main__":  # (python -m minisgl_core.cli, as python -m minisgl_core)
    raise SystemExit(main())
