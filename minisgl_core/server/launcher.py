"""``minisgl serve``: start the worker processes, then the HTTP server, and stop it all cleanly.

The main thread owns the processes and the signals; uvicorn runs in a second thread (so the main
thread is free for the interactive shell of ``serve --shell`` / ``minisgl shell``). SIGINT and
SIGTERM stop everything with exit code 0, after letting in-flight requests finish (a second one
ends that wait at once); a failed child stops everything with exit code 1 and its error in the log,
and a setting a child refused at start-up (StartRefused) is raised once all is stopped, for the
command line to say as its own refusals (exit code 2).
"""

from __future__ import annotations

import _thread
import dataclasses
import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from minisgl_core.api import ProcessContext
from minisgl_core.checkpoint.resolve import served_model_name
from minisgl_core.distributed import RENDEZVOUS_TIMEOUT
from minisgl_core.plugins import Plugins
from minisgl_core.processes.runtime import ChildFailed, Runtime, RuntimeOptions, StartRefused
from minisgl_core.server.api_options import ApiOptions
from minisgl_core.server.limits import ServerLimits

logger = logging.getLogger("minisgl.server")


#: a second SIGTERM or SIGINT this soon after the first is the same one arriving twice (GNU
#: `timeout` signals the server, then its whole process group), not a second request to stop
REPEAT_S = 0.25


class StopRequested(BaseException):
    """Raised in the main thread by SIGTERM, unwinding to the clean-up."""


@dataclass(frozen=True)
class ServeOptions:
    runtime: RuntimeOptions
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    served_model_name: str | None = None
    #: more names a request may send for the model (answers carry ``served_model_name``)
    served_model_aliases: tuple[str, ...] = ()
    log_level: str = "info"
    limits: ServerLimits = ServerLimits()
    #: parsers, CORS and the chat template of the HTTP layer
    api: ApiOptions = field(default_factory=ApiOptions)


#: what to run in the main thread once the server is up: (url, api key, model name, is_failed) -> exit code
Foreground = Callable[[str, "str | None", str, Callable[[], bool]], int]


def _ignore_signals() -> None:
    """A second Ctrl-C or SIGTERM must not interrupt the clean-up."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def serve(opts: ServeOptions, plugins: Plugins, foreground: Foreground | None = None) -> int:
    """Run a server node until a signal, a failed child, or ``foreground`` returning; the exit code."""
    config = opts.runtime.config
    process_ctx = ProcessContext(
        role="api", tp_size=config.tp_size, options=dict(opts.runtime.options or {}), _plugins=plugins
    )
    plugins.call_hook("minisgl_process_start", ctx=process_ctx)
    # (the parsers a chat request builds take it as ctx, when they take one)
    opts = dataclasses.replace(opts, api=dataclasses.replace(opts.api, context=process_ctx))
    opts.api.try_parsers()  # (before the workers start: a broken parser stops the start at once)
    runtime = Runtime(opts.runtime)

    def on_sigterm(signum: int, frame: Any) -> None:
        if runtime.signalled_within(REPEAT_S):
            return
        runtime.note_signal()
        raise StopRequested()

    def on_sigint(signum: int, frame: Any) -> None:
        if runtime.signalled_within(REPEAT_S):
            return
        runtime.note_signal()
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    # Ctrl-C / SIGINT stops the server even where it started ignored (a job in the background of a
    # non-interactive shell inherits SIGINT ignored, and Python then never raises KeyboardInterrupt;
    # uvicorn's and vLLM's servers stop on it all the same)
    signal.signal(signal.SIGINT, on_sigint)
    code = 0
    try:
        started = time.monotonic()
        dist = opts.runtime.dist
        if dist.nnodes > 1:  # (the rendezvous can wait minutes: say for what)
            logger.info(
                "node %d of %d (scheduler ranks %s): waiting up to %d minutes for every node to join at "
                "--dist-init-addr %s",
                dist.node_rank, dist.nnodes, list(dist.local_ranks), RENDEZVOUS_TIMEOUT.total_seconds() // 60,
                dist.init_addr,
            )  # fmt: skip
        info = runtime.start()
        if runtime.is_head:
            code = _serve_head(opts, plugins, runtime, info, started, foreground)
        else:
            logger.info(
                "node %d ready: scheduler ranks %s",
                opts.runtime.dist.node_rank,
                list(opts.runtime.dist.local_ranks),
            )
            # Its ranks exit with the group when node 0 stops; a failed rank is reported below.
            # (Looked at here, not from a thread: a rank that died between a look at the reports
            # and one at the exit codes made this node exit with 0 and say nothing.)
            while runtime.check_children() is None and not runtime.all_exited():
                pass
            if runtime.failure is None:
                runtime.check_children(timeout_ms=0)  # a rank that exited between the two looks
    except (KeyboardInterrupt, StopRequested) as stop:
        logger.info("stopping")
        if foreground is not None and isinstance(stop, KeyboardInterrupt):
            # the shell's Ctrl-C while the model loads (its chat takes those at the prompt): 130,
            # 128 + SIGINT, as every other command's (it was 0); a server's Ctrl-C is how it stops
            code = 130
    except StartRefused:
        raise  # (once the processes are stopped) the command line says it in one line, exit code 2
    except ChildFailed as exc:
        if runtime.failure is None:  # not a child: the HTTP server itself
            logger.critical("%s", exc)
            code = 1
    finally:
        _ignore_signals()
        runtime.stop()
        # stop hooks are logged, never fatal, and one that raises does not skip the others
        for failure in plugins.call_hook("minisgl_process_stop", keep_going=True, ctx=process_ctx):
            logger.warning("%s", failure)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, previous)
    if runtime.failure is not None:  # (critical: --log-level critical hid why the server stopped)
        logger.critical("%s", runtime.failure.rstrip())
        return 1
    return code


def _serve_head(
    opts: ServeOptions,
    plugins: Plugins,
    runtime: Runtime,
    info: dict[str, Any],
    started: float,
    foreground: Foreground | None,
) -> int:
    """Node 0: the HTTP server on top of the worker processes, until it stops; the exit code."""
    config = opts.runtime.config
    name = opts.served_model_name or served_model_name(config.model)
    # A shell waiting for input must learn about a failed child too: interrupt it.
    server, thread, url, state = _start_http(opts, runtime, info, name, interrupt_main=foreground is not None)
    try:
        _log_banner(opts, plugins, info, started, url)
        if foreground is not None:
            return foreground(url, opts.api_key, name, lambda: runtime.failure is not None)
        while thread.is_alive():  # until a failed child makes it exit, or a signal interrupts the wait
            thread.join(0.5)
        return 0
    except (KeyboardInterrupt, StopRequested):
        if runtime.failure is None:
            _drain(state, runtime, opts.limits.shutdown_timeout_s)
        _ignore_signals()
        raise
    finally:
        _ignore_signals()
        server.should_exit = True
        thread.join(10)


def _drain(state: Any, runtime: Runtime, timeout_s: float) -> None:
    """Let in-flight requests finish for up to ``timeout_s`` while new ones get 503; then end the
    rest with an error (an error event and [DONE] on a stream), so no client sees a cut connection.
    HTTP requests still open count too (a body still arriving gets its 503 once read)."""
    # A second Ctrl-C or SIGTERM ends the wait (as uvicorn's and vLLM's): whoever sends it wants
    # the server gone now, not after the rest of the timeout.
    second: list[int] = []

    def again(signum: int, frame: Any) -> None:
        if not runtime.signalled_within(REPEAT_S):
            second.append(signum)

    signal.signal(signal.SIGINT, again)
    signal.signal(signal.SIGTERM, again)
    state.loop.call_soon_threadsafe(state.start_draining)
    deadline = time.monotonic() + timeout_s
    if state.pending or state.open_requests:
        logger.info(
            "draining %d in-flight requests (%d HTTP requests open) for up to %gs (SIGTERM or Ctrl-C again stops now)",
            len(state.pending), state.open_requests, timeout_s,
        )  # fmt: skip
    while (
        (state.pending or state.open_requests)
        and time.monotonic() < deadline
        and runtime.failure is None
        and not second
    ):
        time.sleep(0.05)
    _ignore_signals()
    if second:
        logger.warning(
            "%s again: aborting %d in-flight requests and stopping now",
            signal.Signals(second[0]).name, len(state.pending),
        )  # fmt: skip
    elif state.pending or state.open_requests:
        why = (
            "a worker failed"
            if runtime.failure is not None
            else f"the drain ran out of its {timeout_s:g}s (--shutdown-timeout)"
        )
        logger.warning("%s: ending %d unfinished requests with an error", why, len(state.pending))
    state.loop.call_soon_threadsafe(state.fail, "the server is shutting down")


def _log_banner(opts: ServeOptions, plugins: Plugins, info: dict[str, Any], started: float, url: str) -> None:
    config = opts.runtime.config
    logger.info(
        "minisgl ready in %.1fs: model=%s (%s) plugins=[%s] attn=%s cache=%s policy=%s tp=%d "
        "kv_capacity=%d tokens context=%d url=%s",
        time.monotonic() - started,
        config.model,
        info.get("architecture"),
        plugins.summary(),
        "/".join(dict.fromkeys(info.get("attn", []))),
        config.cache,
        config.policy,
        config.tp_size,
        info["kv_capacity_tokens"],
        info["max_context_len"],
        url,
    )


def _start_http(opts: ServeOptions, runtime: Runtime, info: dict[str, Any], name: str, interrupt_main: bool):
    import uvicorn

    from minisgl_core.server.app import create_app
    from minisgl_core.server.state import ModelInfo, ServerState

    model = ModelInfo(
        name,
        opts.runtime.config.model,
        info["max_context_len"],
        info["kv_capacity_tokens"],
        info["vocab_size"],
        opts.runtime.sampling_defaults or {},
        info.get("max_token_chars"),
        tuple(alias for alias in opts.served_model_aliases if alias != name),
        opts.runtime.config.policy,
        info.get("uses_priority", False),
    )
    state = ServerState(runtime.endpoints, model, limits=opts.limits, process_problem=runtime.process_problem)
    app = create_app(state, opts.api_key, opts.api, {**info, "tp_size": opts.runtime.config.tp_size})
    uv_level = "debug" if opts.log_level.lower() == "debug" else "warning"
    config = uvicorn.Config(
        app,
        host=opts.host,
        port=opts.port,
        log_level=uv_level,
        access_log=False,
        log_config=None,
        timeout_graceful_shutdown=3,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="minisgl-http", daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise ChildFailed(
                f"the HTTP server could not start on {opts.host}:{opts.port} (see the log above)"
            )
        time.sleep(0.05)

    def on_failure(summary: str) -> None:
        try:
            state.loop.call_soon_threadsafe(state.fail, summary)
        except RuntimeError:  # the loop has closed: the server is stopping already
            pass
        server.should_exit = True
        if interrupt_main:
            _thread.interrupt_main()

    runtime.supervise(on_failure)
    port = server.servers[0].sockets[0].getsockname()[1]
    host = f"[{opts.host}]" if ":" in opts.host else opts.host
    return server, thread, f"http://{host}:{port}", state
