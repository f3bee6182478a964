"""What the HTTP layer does beyond passing requests on: the output parsers chosen at start-up,
CORS, how many responses it stores, and a tokenizer of its own for /tokenize, /detokenize and echoing token-id prompts."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any

from minisgl_core.api import ProcessContext, ReasoningParser, ToolParser
from minisgl_core.server.responses_store import DEFAULT_STORE_SIZE


@dataclass(frozen=True)
class ApiOptions:
    #: ``--tool-call-parser``: reads tool calls when tool_choice is "auto"
    tool_parser: type[ToolParser] | None = None
    #: ``--reasoning-parser``: splits reasoning_content from every chat answer
    reasoning_parser: type[ReasoningParser] | None = None
    #: ``--allowed-origins``: CORS is off when empty
    allowed_origins: tuple[str, ...] = ()
    #: ``--chat-template`` text, so /tokenize renders messages as the tokenizer worker does
    chat_template: str | None = None
    #: each parser class above -> how errors name it: ``reasoning parser 'qwen3' (plugin
    #: 'qwen3-reasoning', minisgl-plugin-qwen3-reasoning 0.1.0)``, as the command line selected it
    parser_labels: dict[type, str] = field(default_factory=dict)
    #: ``--responses-store-size``: the most /v1/responses answers kept for GET and
    #: previous_response_id (0: none)
    responses_store_size: int = DEFAULT_STORE_SIZE
    #: ``--trust-request-chat-template``: a chat request's (or /tokenize's) own ``chat_template``
    #: renders its messages; off, such a request is a 400 (vLLM's flag and default)
    trust_request_chat_template: bool = False
    #: ``--speculative-algorithm`` is set: a chat request's ``prediction`` has a drafter to feed
    #: (without one it is a 400, not ignored)
    speculative_decoding: bool = False
    #: the API process's context, which a parser whose constructor takes ``ctx`` is built with
    #: (set once the process started: :func:`~minisgl_core.server.launcher.serve`)
    context: ProcessContext | None = None

    def try_parsers(self) -> None:
        """Build each selected parser once, as a chat request does (a tool parser offered one
        function), raising a PluginFailure naming the selection and its plugin if one cannot be
        built. The server builds one per choice, so a constructor that raises failed every chat
        request with a 500 while the server looked healthy. Called after the API process's
        ``minisgl_process_start``, where a parser reading its plugin's options finds them."""
        from minisgl_core.engine.plugin_failures import PluginFailure
        from minisgl_core.plugins import build

        for cls, call in ((self.tool_parser, (PROBE_TOOLS,)), (self.reasoning_parser, ())):
            if cls is None:
                continue
            try:
                build(cls, self.context, *call)
            except Exception as exc:
                label = self.parser_labels.get(cls, cls.__qualname__)
                what = f"{label} failed in {cls.__qualname__}.__init__"
                raise PluginFailure(
                    f"{what}: {type(exc).__name__}: {exc}", f"{what} with {type(exc).__name__}"
                ) from exc


#: the ``tools`` a tool parser is built with when :meth:`ApiOptions.try_parsers` tries it
PROBE_TOOLS = [
    {"type": "function", "function": {"name": "probe", "parameters": {"type": "object", "properties": {}}}}
]


@dataclass
class ApiTokenizer:
    """The model's tokenizer in the API process, loaded on first use (most servers never need it)."""

    model_path: str
    chat_template: str | None = None
    _tokenizer: Any = None
    _special_texts: tuple[str, ...] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self) -> Any:
        with self._lock:
            if self._tokenizer is None:
                from minisgl_core.tokenizer.load import load_tokenizer

                self._tokenizer = load_tokenizer(self.model_path, chat_template=self.chat_template)
            return self._tokenizer

    def special_texts(self) -> tuple[str, ...]:
        """The text of each special token, longest first (read once)."""
        if self._special_texts is None:
            from minisgl_core.tokenizer.detokenize import special_token_texts

            self._special_texts = special_token_texts(self.get())
        return self._special_texts

    async def run(self, work: Any, *args: Any, **kwargs: Any) -> Any:
        """``work(tokenizer, *args, **kwargs)`` off the event loop (tokenizing can take a while)."""
        return await asyncio.to_thread(lambda: work(self.get(), *args, **kwargs))
