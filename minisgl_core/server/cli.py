"""``minisgl serve`` and ``minisgl shell``: their options, and turning them into a running server."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import socket
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from minisgl_core import environment
from minisgl_core.checkpoint.resolve import DEMO
from minisgl_core.config import ConfigError, EngineConfig, check_api_key
from minisgl_core.grammars import check_grammar_backend
from minisgl_core.plugins import Plugins
from minisgl_core.sampling import LONE_SURROGATE, cut
from minisgl_core.server.limits import add_limit_args, limits_from_args
from minisgl_core.server.responses_store import DEFAULT_STORE_SIZE, MAX_STORED_CHARS

logger = logging.getLogger(__name__)


#: --tp-peer-timeout's default
TP_PEER_TIMEOUT_S = 30.0


def _port(text: str) -> int:
    value = int(text) if text.strip().isascii() and text.strip().isdigit() else -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port, 0 to 65535 (0 = any free port), got {text}")
    return value


def _check_listen(host: str, port: int) -> None:
    """Bind ``host:port`` once and let go, before the model loads: an address in use or not of
    this machine is then one line at once, not a failed start after the workers came up."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError) as exc:
        raise ConfigError(
            f"--host {host!r} is not an address: {getattr(exc, 'strerror', None) or exc}; "
            "give one of this machine's, e.g. 127.0.0.1 or 0.0.0.0"
        ) from None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the HTTP server binds
        try:
            probe.bind(address)
        except OSError as exc:
            raise ConfigError(
                f"cannot listen on {host}:{port}: {exc.strerror or exc}; pick another --port, or a "
                "--host of this machine (or stop what holds the port)"
            ) from None


def _check_rendezvous(init_addr: str) -> None:
    """Bind node 0's ``--dist-init-addr`` once and let go, as :func:`_check_listen` the HTTP port:
    scheduler 0 listens there for the other ranks (on this host only, so 0.0.0.0 is no answer)."""
    host, port = init_addr.rsplit(":", 1)
    host = host.strip("[]")
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as scheduler 0 binds it
        try:
            probe.bind((host, int(port)))
        except (OSError, UnicodeError, TypeError) as exc:  # (a host not encodable: a TypeError)
            why = getattr(exc, "strerror", None) or str(exc)
            shown = init_addr.encode("utf-8", "backslashreplace").decode("utf-8")  # (a lone surrogate)
            raise ConfigError(
                f"cannot listen on --dist-init-addr {shown} for the TP rendezvous: "
                f"{why}; give an address of this machine with a free port"
            ) from None


def _add_http_args(p: argparse.ArgumentParser, port: int) -> None:
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback only)")
    g.add_argument("--port", type=_port, default=port, help="HTTP port (0 = any free port)")
    g.add_argument(
        "--api-key",
        default=environment.get("MINISGL_API_KEY"),
        help="require 'Authorization: Bearer KEY' on every endpoint but /health and /ping (env MINISGL_API_KEY)",
    )
    g.add_argument(
        "--served-model-name",
        default=None,
        nargs="+",
        metavar="NAME",
        type=_served_name,
        help="model id in the API (default: the model directory's name, ORG/NAME for a hub id, a .gguf "
        "file's stem); more names are aliases a request may send, the first is the id answers carry",
    )
    g.add_argument(
        "--tool-call-parser",
        default=None,
        metavar="NAME",
        help="read tool calls from chat answers with this parser (tool_choice 'auto')",
    )
    g.add_argument(
        "--reasoning-parser",
        default=None,
        metavar="NAME",
        help="split reasoning_content from chat answers with this parser",
    )
    g.add_argument(
        "--chat-template",
        default=None,
        metavar="PATH|NAME",
        help="a Jinja chat template file replacing the tokenizer's own, or a bundled template's name: "
        "chatml-tools (ChatML with Hermes tool calls, for ChatML models whose template has no tools, "
        "such as the default model; with --tool-call-parser hermes)",
    )
    g.add_argument(
        "--trust-request-chat-template",
        action="store_true",
        help="let a request's own chat_template (Jinja text; /v1/chat/completions, /tokenize) "
        "render its messages instead of the model's or --chat-template's; off by default, such a "
        "request is refused (400): the template runs in the server's tokenizer worker, where a slow "
        "one holds up every other request",
    )
    g.add_argument(
        "--allowed-origins",
        default="",
        metavar="ORIGINS",
        help="comma-separated origins browsers may call the API from, each scheme://host[:port] "
        "(CORS; '*' = any); off by default",
    )
    g.add_argument(
        "--responses-store-size",
        type=_store_size,
        default=DEFAULT_STORE_SIZE,
        metavar="N",
        help="the most /v1/responses answers kept in memory (store: true, OpenAI's default) for "
        "GET /v1/responses/{id} and previous_response_id, the oldest dropped first (also past "
        f"{MAX_STORED_CHARS >> 20} Mi characters of JSON in all); 0 stores none (default: %(default)s)",
    )
    g.add_argument("--nnodes", type=int, default=1, help="nodes the TP group spans")
    g.add_argument("--node-rank", type=int, default=0, help="this node's index (0 runs the API server)")
    g.add_argument(
        "--dist-init-addr",
        default=None,
        type=_host_port,
        help="HOST:PORT where the TP ranks meet (default: a free loopback port; needed with --nnodes > 1)",
    )
    g.add_argument(
        "--tp-peer-timeout",
        type=float,
        default=TP_PEER_TIMEOUT_S,
        metavar="SECONDS",
        help="a tensor-parallel rank silent this long (its process stopped, its node gone) stops the "
        "server instead of leaving the others waiting on it (default 30; inf: never)",
    )


def _store_size(text: str) -> int:
    value = int(text) if text.strip().isascii() and text.strip().isdigit() else -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a whole number of responses, 0 or more, got {text!r}")
    return value


def _served_name(text: str) -> str:
    """A model id clients can send: an empty one was taken as unset (the model directory's name
    was served) and a blank one served a model no client would name."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            f"got {text!r}: give the model id clients send as 'model', or leave the flag out to "
            "serve the model directory's name"
        )
    return text


def _host_port(text: str) -> str:
    """HOST:PORT ([IPv6]:PORT), checked before any process starts (a bad one was a traceback from a
    scheduler rank once the model was loading)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host.strip("[]") or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"must be HOST:PORT with a port in [1, 65535], got {text!r}")
    return text


#: the terminal chat's reply length unless --max-tokens says
SHELL_MAX_TOKENS = 512
#: (flag, dest) of the shell's own settings, which serve takes with --shell only
SHELL_FLAGS = (("--temperature", "temperature"), ("--max-tokens", "max_tokens"), ("--system", "system"))
#: the shell's options that --url uses; the others set up the server the shell starts (--url starts none)
URL_DESTS = frozenset({"help", "url", "api_key", "served_model_name", *(dest for _, dest in SHELL_FLAGS)})


def _add_shell_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("shell")
    g.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="sampling temperature (default: the model's, else 1.0)",
    )
    g.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="longest reply in tokens (default: what the context leaves, at most the model's default; "
        f"at most {SHELL_MAX_TOKENS} on the server `minisgl shell` starts)",
    )
    g.add_argument("--system", default=None, help="system prompt")


def _add_plugin_args(p: argparse.ArgumentParser, plugins: Plugins | None) -> None:
    """Let plugins add their (namespaced) options, and remember which ones are theirs."""
    if plugins is None:
        return
    before = {a.dest for a in p._actions}
    # a broken plugin must not break the CLI, nor take the other plugins' options with it
    for failure in plugins.add_cli_options(p):
        if str(failure) not in _WARNED_OPTION_HOOKS:  # (once: the parser is built per subcommand)
            _WARNED_OPTION_HOOKS.add(str(failure))
            logger.warning("%s; its options are not available", failure)
    p.set_defaults(plugin_dests=sorted({a.dest for a in p._actions} - before))


_WARNED_OPTION_HOOKS: set[str] = set()


def add_server_commands(subparsers: Any, plugins: Plugins | None = None) -> None:
    from minisgl_core.config_args import add_engine_args

    if plugins is None:
        try:
            plugins = Plugins.load()
        except Exception as exc:  # noqa: BLE001
            logger.warning("could not load plugins for their CLI options: %s", exc)

    p = subparsers.add_parser("serve", help="run the OpenAI-compatible HTTP server")
    add_engine_args(p)
    _add_http_args(p, port=8000)
    add_limit_args(p)
    p.add_argument("--shell", action="store_true", help="also chat with the server in this terminal")
    _add_shell_args(p)
    _add_plugin_args(p, plugins)
    p.set_defaults(func=_cmd_serve)

    p = subparsers.add_parser(
        "shell",
        help="chat with a model in the terminal",
        description="Chat with a model in the terminal (or answer one turn per line of a piped script). "
        "Exit status: 1 when a turn failed (an error line in place of the reply) or the server "
        "stopped, else 0.",
    )
    add_engine_args(p)
    _add_http_args(p, port=0)
    add_limit_args(p)
    p.add_argument(
        "--url", default=None, help="chat with a server already running there instead of starting one"
    )
    _add_shell_args(p)
    _add_plugin_args(p, plugins)
    p.set_defaults(func=_cmd_shell, server_flags=_server_flags(p))


def _server_flags(p: argparse.ArgumentParser) -> tuple[tuple[str, str, Any], ...]:
    """(flag, dest, default) of each option of ``p`` that sets up the server the shell starts."""
    return tuple(
        (action.option_strings[-1], action.dest, action.default)
        for action in p._actions
        if action.option_strings and action.dest not in URL_DESTS
    )


def _server_url(text: str) -> str:
    """--url checked before any request (a malformed one was a ValueError traceback, a port past
    65535 "Connection refused"), as :func:`base_url` spells it."""
    import urllib.parse

    if not text.strip():  # (it was taken as --url left out: the shell started a server of its own)
        raise ConfigError(
            "--url is empty: give the server's address, e.g. http://127.0.0.1:8000, or leave --url out"
        )
    try:
        parts = urllib.parse.urlsplit(text)
    except ValueError as exc:  # "Invalid IPv6 URL"
        raise ConfigError(f"--url {text!r} is not a URL: {exc}") from None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"--url {text!r}: give the server's address, e.g. http://127.0.0.1:8000")
    try:
        port = parts.port
    except ValueError:  # out of range, or not a number
        port = 0
    if port == 0:
        raise ConfigError(f"--url {text!r}: the port must be a number from 1 to 65535")
    if (problem := host_problem(parts.hostname)) is not None:
        raise ConfigError(f"--url {cut(text)!r}: {problem}")
    return base_url(text)


def host_problem(host: str) -> str | None:
    """Why a URL's ``host`` is no name a lookup takes, or None: a label past 63 characters or an
    empty one (``a..b``) was UnicodeError's traceback from the first request (the IDNA encoding
    every lookup makes). ``shell --url`` and ``bench serve --url`` both check it."""
    try:
        host.encode("idna")
    except UnicodeError:
        return "the host name has a part longer than 63 characters or an empty one; give the server's address"
    return None


def base_url(url: str) -> str:
    """``url`` without a trailing slash or ``/v1``: the server's address, where the commands add
    ``/v1/...`` themselves (an OpenAI client's base URL ends in /v1: ``--url .../v1`` asked for
    ``/v1/v1/models``, a 404). ``shell --url`` and ``bench serve --url`` both read it so."""
    url = url.rstrip("/")
    return url.removesuffix("/v1")


#: options no plugin is shown: the worker processes get ProcessContext.options too
SECRET_OPTIONS = frozenset({"api_key"})


def _plain_options(args: argparse.Namespace) -> dict[str, Any]:
    """CLI options as plain values, for plugins' ProcessContext.options (secrets left out)."""
    plain = (str, int, float, bool, type(None))
    return {
        k: v
        for k, v in vars(args).items()
        if k not in SECRET_OPTIONS
        and (isinstance(v, plain) or (isinstance(v, list) and all(isinstance(x, plain) for x in v)))
    }


def _serve_options(args: argparse.Namespace):
    from minisgl_core.checkpoint.formats import open_model
    from minisgl_core.checkpoint.generation_defaults import describe, end_of_sequence, load_sampling_defaults
    from minisgl_core.config_args import check_heads_split, engine_config_from_args
    from minisgl_core.distributed import DistributedSpec
    from minisgl_core.processes.runtime import RuntimeOptions
    from minisgl_core.server.launcher import ServeOptions
    from minisgl_core.server.routes import reasoning_tags

    if args.api_key is not None and not args.api_key.strip():
        raise ConfigError(
            "--api-key is empty (or MINISGL_API_KEY is set to nothing): give a key, or leave both "
            "unset for a server without authentication"
        )
    check_api_key(args.api_key)
    if args.api_key and environment.get("MINISGL_API_KEY") != args.api_key:
        logger.warning(
            "--api-key is visible to every local user in the process list; prefer env MINISGL_API_KEY"
        )
    # Only the API server checks the key: the worker processes need not inherit it.
    environment.forget("MINISGL_API_KEY")
    plugins = Plugins.load(disable=args.disable_plugin)
    plugin_options = {d: getattr(args, d) for d in getattr(args, "plugin_dests", [])}
    # (the model checked too: a bad file fails here in one line, before any process starts)
    config = engine_config_from_args(args, plugin_options, plugins)
    _check_attention_choice(config, plugins)
    if config.tp_size > 1:
        check_heads_split(config.model, config.tp_size, plugins)
    # (said once: by the node that serves HTTP)
    check_grammar_backend(
        plugins, config.grammar_backend, EngineConfig.grammar_backend, warn=args.node_rank == 0
    )
    if args.nnodes > 1 and not args.dist_init_addr:
        raise ConfigError("--nnodes > 1 needs --dist-init-addr HOST:PORT (rank 0's node)")
    try:
        dist = DistributedSpec(
            tp_size=config.tp_size,
            nnodes=args.nnodes,
            node_rank=args.node_rank,
            init_addr=args.dist_init_addr or "",  # "": one node, a loopback port picked at start-up
            peer_timeout_s=args.tp_peer_timeout,
        )
    except ValueError as exc:  # the message names the flags
        raise ConfigError(str(exc)) from None
    if dist.tp_size == 1:  # (accepted and used by nothing: one process binds no rendezvous, watches no peer)
        given = [
            flag
            for flag, value, default in (
                ("--dist-init-addr", args.dist_init_addr, None),
                ("--tp-peer-timeout", args.tp_peer_timeout, TP_PEER_TIMEOUT_S),
            )
            if value != default
        ]
        if given:
            raise ConfigError(
                f"{', '.join(given)}: the tensor-parallel ranks' settings, unused with --tp 1; leave "
                f"{'it' if len(given) == 1 else 'them'} out, or give --tp N"
            )
    chat_template = _read_chat_template(args.chat_template)
    if dist.node_rank == 0:  # the node that serves HTTP
        # (each passed the probes below alone; then the rendezvous took the port from the HTTP server)
        if dist.init_addr and int(dist.init_addr.rsplit(":", 1)[1]) == args.port:
            shown = dist.init_addr.encode("utf-8", "backslashreplace").decode("utf-8")  # (a lone surrogate)
            raise ConfigError(
                f"--dist-init-addr {shown} is on the HTTP server's --port {args.port}: the TP "
                "rendezvous needs a port of its own; give another"
            )
        _check_listen(args.host, args.port)
        if dist.init_addr:  # (a busy one was scheduler 0's traceback once the workers had started)
            _check_rendezvous(dist.init_addr)
    limits = limits_from_args(args)
    api = _api_options(args, plugins, chat_template)
    # every setting checked: an error above is the only line the command prints
    sampling_defaults = load_sampling_defaults(config.model, config.generation_config, plugins)
    # the end-of-sequence ids are read whatever --generation-config says: a file the engine cannot
    # use is one line here, not the scheduler's traceback after the weights load
    end_of_sequence(open_model(config.model, plugins))
    logger.info("%s", describe(sampling_defaults))
    runtime = RuntimeOptions(
        chat_template=chat_template,
        config=config,
        dist=dist,
        fingerprint=plugins.fingerprint(),
        plugin_state=plugins.state(),
        disable_plugins=tuple(args.disable_plugin),
        log_level=args.log_level,
        options=_plain_options(args),
        sampling_defaults=sampling_defaults,
        reasoning_tags=reasoning_tags(api),
    )
    names = args.served_model_name or []
    if names:  # the first answers; the rest (repeats dropped) are aliases a request may send
        name, aliases = names[0], tuple(dict.fromkeys(n for n in names[1:] if n != names[0]))
    else:  # `--model demo` is served as demo-qwen3 (its directory); a request naming "demo" finds it too
        name, aliases = None, (DEMO,) if args.model == DEMO else ()
    opts = ServeOptions(
        runtime=runtime,
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        served_model_name=name,
        served_model_aliases=aliases,
        log_level=args.log_level,
        limits=limits,
        api=api,
    )
    return opts, plugins


def _check_attention_choice(config: EngineConfig, plugins: Plugins) -> None:
    """The --attn backends refused as the model runner refuses them (a backend that does not run
    its role's steps, ``--attn triton``: decode only; a pool dtype or page size it does not take),
    before any process starts: the scheduler refused them once started (exit code 1, said twice).
    Whether they run on this device is asked on a CPU only (engine_config_from_args did): on a GPU
    asking may start CUDA in this process, which runs no model; the scheduler asks there."""
    from minisgl_core.runner.model_runner import check_attention_choice

    device = config.resolve_device()
    check_attention_choice(config, plugins, device, ask_device=device.type == "cpu")


def _read_chat_template(path: str | None) -> str | None:
    """The template's text, compiled once here: a syntax error is a start-up error, not a 400 on
    every chat request later."""
    if path is None:
        return None
    from minisgl_core.tokenizer.chat_input import BUNDLED_CHAT_TEMPLATES, bundled_chat_template

    if not path.strip():  # ("" was read as the working directory: "cannot read : Is a directory")
        names = ", ".join(BUNDLED_CHAT_TEMPLATES)
        raise ConfigError(
            f"--chat-template {path!r} is empty: give a Jinja chat template file or a bundled "
            f"template's name ({names}), or leave the flag out for the tokenizer's own template"
        )
    try:
        exists = Path(path).exists()
    except OSError:  # a name too long to look up was an OSError traceback: read below, it says so
        exists = False
    bundled = None if exists else bundled_chat_template(path)
    if bundled is not None:  # (a file of that name in the working directory comes first)
        return bundled
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        names = ", ".join(BUNDLED_CHAT_TEMPLATES)
        raise ConfigError(
            f"--chat-template: cannot read {path}: {exc.strerror or exc} (give a template file, or a "
            f"bundled template's name: {names})"
        ) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"--chat-template: {path} is not UTF-8 text ({exc.reason})") from None
    if not text.strip():  # (taken as "no template": every chat turn then said the tokenizer has none)
        raise ConfigError(f"--chat-template: {path} is empty; give a Jinja chat template file")
    from minisgl_core.tokenizer.chat_input import compile_chat_template, has_jinja

    if not has_jinja(text):  # (served, it rendered every conversation as that same text)
        raise ConfigError(
            f"--chat-template: {path} has no Jinja in it (no {{{{ }}}} or {{% %}}); give a Jinja chat "
            "template file"
        )
    from jinja2 import TemplateSyntaxError

    try:
        compile_chat_template(text)
    except TemplateSyntaxError as exc:
        raise ConfigError(f"--chat-template: {path}, line {exc.lineno}: {exc.message}") from None
    return text


def _api_options(args: argparse.Namespace, plugins: Plugins, chat_template: str | None):
    """The HTTP layer's options, the parsers resolved now so that a wrong name fails at start-up."""
    from minisgl_core.server.api_options import ApiOptions

    # an unknown name is a PluginError: the command line says it in one line (exit code 2); an
    # empty one too ("" served without a parser, as if the flag had been left out)
    tool_parser = (
        plugins.resolve("tool_parsers", args.tool_call_parser) if args.tool_call_parser is not None else None
    )
    reasoning_parser = (
        plugins.resolve("reasoning_parsers", args.reasoning_parser)
        if args.reasoning_parser is not None
        else None
    )
    from minisgl_core.engine.plugin_failures import selected_plugin

    labels = {
        cls: selected_plugin(plugins, kind, name)
        for cls, kind, name in (
            (tool_parser, "tool_parsers", args.tool_call_parser),
            (reasoning_parser, "reasoning_parsers", args.reasoning_parser),
        )
        if cls is not None
    }
    origins = tuple(_origin(o.strip()) for o in args.allowed_origins.split(",") if o.strip())
    return ApiOptions(
        tool_parser,
        reasoning_parser,
        origins,
        chat_template,
        labels,
        responses_store_size=args.responses_store_size,
        trust_request_chat_template=args.trust_request_chat_template,
        speculative_decoding=getattr(args, "speculative_algorithm", None) is not None,
    )


def _origin(text: str) -> str:
    """One of ``--allowed-origins``, as a browser's Origin header writes it (scheme and host in
    lower case). A path or a trailing slash (``https://app.example/``) never matched a browser's
    Origin: every preflight from it was refused, with nothing said at start-up (a probe's find)."""
    if text == "*":
        return text
    try:
        parts = urlsplit(text)
        port = parts.port  # (a ValueError where it is no number)
    except ValueError:
        parts = port = None
    if (
        parts is None
        or not parts.scheme
        or not parts.hostname
        or parts.username is not None
        or parts.path
        or parts.query
        or parts.fragment
        or text.endswith(("?", "#"))
    ):
        raise ConfigError(
            f"--allowed-origins: {text!r} is not an origin: give scheme://host[:port] with nothing "
            "after it, as a browser sends it (e.g. https://app.example), or '*'"
        )
    if not parts.hostname.isascii():  # (never matched: a browser's Origin has it in punycode)
        raise ConfigError(
            f"--allowed-origins: {text!r}: a browser sends a host that is not ASCII in its punycode "
            "form (xn--...); give that form"
        )
    scheme = parts.scheme.lower()
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname  # (IPv6)
    if port is None or DEFAULT_PORTS.get(scheme) == port:  # (a browser leaves the default out)
        return f"{scheme}://{host}"
    return f"{scheme}://{host}:{port}"


#: the ports a browser's Origin leaves out
DEFAULT_PORTS = {"http": 80, "https": 443}


def _shell_foreground(args: argparse.Namespace):
    """The shell, run in the launcher's main thread once the server is up."""
    from minisgl_core.server.shell import run_shell

    def foreground(url: str, api_key: str | None, model: str, is_failed) -> int:
        return run_shell(
            url,
            api_key,
            model,
            is_failed,
            temperature=args.temperature,
            max_tokens=args.max_tokens,  # None: what the context leaves (the server's default)
            system=args.system,
        )

    return foreground


def _check_shell_args(args: argparse.Namespace) -> None:
    """The shell's --temperature and --max-tokens, checked before anything loads (as generate's):
    a bad one made every turn an error after the model had loaded."""
    from minisgl_core.sampling import SamplingParams

    try:
        SamplingParams(
            temperature=1.0 if args.temperature is None else args.temperature,
            max_tokens=SHELL_MAX_TOKENS if args.max_tokens is None else args.max_tokens,
        )
    except ValueError as exc:  # the message names the field
        raise ConfigError(str(exc), *(f for f in ("temperature", "max_tokens") if f in str(exc))) from None
    # a byte that is not UTF-8 comes through argv as a lone surrogate: the server refused every
    # turn naming a JSON path ("messages.0.content: invalid text")
    if args.system is not None and (bad := LONE_SURROGATE.search(args.system)) is not None:
        raise ConfigError(
            f"--system is not valid UTF-8 text (a byte 0x{ord(bad.group()) & 0xFF:02x} at character "
            f"{bad.start()}): pass text in UTF-8"
        )


def _check_reply_fits(max_tokens: int | None, context_len: int | None, model: str) -> None:
    """--max-tokens as long as the context leaves no room for a prompt: every turn would be
    refused, after the model had loaded."""
    if max_tokens is not None and context_len is not None and max_tokens >= context_len:
        raise ConfigError(
            f"max_tokens {max_tokens} leaves no room for a prompt in the context length {context_len} "
            f"of {model}; lower max_tokens, or leave it unset (a reply then gets what the context leaves)",
            "max_tokens",
        )


def _context_len(config: EngineConfig, plugins: Plugins) -> int | None:
    """The context length the server will have, decided as the model runner does (None: the model
    cannot say yet; the server then reports the problem)."""
    from minisgl_core.checkpoint.buildable import model_config
    from minisgl_core.checkpoint.formats import open_model

    try:
        hf = model_config(open_model(config.model, plugins).hf_config(), plugins)
        max_pos = int(hf.get("max_position_embeddings", 4096))
    except (OSError, ValueError):
        return config.max_context_len
    return min(config.max_context_len or max_pos, max_pos)


def _cmd_serve(args: argparse.Namespace) -> int:
    from minisgl_core.server.launcher import serve

    if args.shell:
        _check_shell_args(args)
    else:  # (they were accepted and used by nothing)
        given = [flag for flag, value in SHELL_FLAGS if getattr(args, value) is not None]
        if given:
            raise ConfigError(
                f"{', '.join(given)}: the terminal chat's settings; add --shell (or run `minisgl shell`)"
            )
    opts, plugins = _serve_options(args)
    if args.shell:
        config = opts.runtime.config
        _check_reply_fits(args.max_tokens, _context_len(config, plugins), config.model)
    return serve(opts, plugins, _shell_foreground(args) if args.shell else None)


def _cmd_shell(args: argparse.Namespace) -> int:
    if args.url is not None:
        args.url = _server_url(args.url)
        # (they were accepted and used by nothing, as serve's shell flags without --shell)
        given = [flag for flag, dest, default in args.server_flags if getattr(args, dest) != default]
        if given:
            raise ConfigError(
                f"{', '.join(given)} {'has' if len(given) == 1 else 'have'} no effect with --url: the "
                f"server at {args.url} was started with its own"
            )
    _check_shell_args(args)
    check_api_key(args.api_key)
    if args.url is not None:
        model, context_len = (args.served_model_name or [None])[0], None
        if model is None:
            model, context_len = _served_model(args.url, args.api_key)
        _check_reply_fits(args.max_tokens, context_len, f"the server at {args.url}")
        return _shell_foreground(args)(args.url, args.api_key, model, lambda: False)
    from minisgl_core.server.launcher import serve

    if args.log_level == "info":  # the shell's own output is the conversation
        logging.getLogger().setLevel(logging.WARNING)
        args.log_level = "warning"
    opts, plugins = _serve_options(args)
    config = opts.runtime.config
    _check_reply_fits(args.max_tokens, _context_len(config, plugins), config.model)
    if args.max_tokens is None:  # none is sent: its server gives a reply what the context leaves, at most 512
        defaults = opts.runtime.sampling_defaults or {}
        cap = min(defaults.get("max_tokens") or SHELL_MAX_TOKENS, SHELL_MAX_TOKENS)
        runtime = dataclasses.replace(opts.runtime, sampling_defaults={**defaults, "max_tokens": cap})
        opts = dataclasses.replace(opts, runtime=runtime)
    # Loading takes a while (seconds to minutes): say so on stderr, so stdout stays the conversation.
    try:
        device = config.resolve_device().type
    except ValueError:
        device = config.device  # the scheduler reports the problem
    print(
        f"minisgl shell: loading {config.model} on {device} (attn {config.attn}, tp {config.tp_size}) ...",
        file=sys.stderr,
        flush=True,
    )
    started = time.monotonic()
    chat = _shell_foreground(args)

    def foreground(url: str, api_key: str | None, model: str, is_failed) -> int:
        print(
            f"minisgl shell: {model} ready in {time.monotonic() - started:.1f}s", file=sys.stderr, flush=True
        )
        return chat(url, api_key, model, is_failed)

    return serve(opts, plugins, foreground)


def _served_model(url: str, api_key: str | None) -> tuple[str, int | None]:
    """The first model the server at ``url`` lists, and its context length when it says; a server
    that cannot be reached, or answers as no minisgl server would, ends the command in one line."""
    import http.client
    import json
    import urllib.error
    import urllib.request

    where = f"{url}/v1/models"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(where, headers=headers), timeout=60) as resp:
            body = resp.read()
    except urllib.error.HTTPError as exc:  # reached: it refused (a missing or wrong key: 401)
        fix = (
            ": give its key with --api-key (or MINISGL_API_KEY)" if exc.code == 401 and not api_key
            else ": check --api-key" if exc.code == 401 else ""
        )  # fmt: skip
        raise SystemExit(
            f"minisgl shell: the server at {url} answered {where} with HTTP {exc.code}{fix}"
        ) from None
    except (OSError, http.client.HTTPException) as exc:  # URLError is an OSError
        raise SystemExit(f"minisgl shell: cannot reach the server at {url}: {exc}") from None
    try:
        models = json.loads(body)["data"]
    except (ValueError, LookupError, TypeError):  # (not JSON, not UTF-8, no "data" list)
        raise SystemExit(
            f"minisgl shell: --url {url}: {where} answered {body[:80].decode(errors='replace')!r}, not "
            "a list of models; is it a minisgl (OpenAI-compatible) server?"
        ) from None
    if not isinstance(models, list) or not models or not isinstance(models[0], dict) or "id" not in models[0]:
        raise SystemExit(
            f"minisgl shell: --url {url}: {where} lists no model; is it a minisgl (OpenAI-compatible) "
            "server? (--served-model-name names the model instead)"
        )
    context_len = models[0].get("max_model_len")
    return str(models[0]["id"]), context_len if type(context_len) is int else None
