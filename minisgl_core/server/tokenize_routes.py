"""/tokenize, /detokenize (vLLM's and SGLang's shapes) and /version.

/tokenize counts tokens the way the generating routes do: a ``prompt`` is encoded with the
tokenizer's special tokens, a Llama's BOS (as /v1/completions does; ``add_special_tokens`` false
leaves them out, there too), ``messages`` are rendered
with the chat template (the request's ``chat_template`` where the server trusts requests'
templates, else the server's ``--chat-template`` if given), tools and template variables included.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import Field, field_validator, model_validator

from minisgl_core.server.api_options import ApiOptions, ApiTokenizer
from minisgl_core.server.errors import APIError
from minisgl_core.server.schemas import (
    Bool,
    ChatMessage,
    FreeObject,
    Int,
    StrictModel,
    Text,
    ToolDefinition,
    chat_template_args,
    check_request_template,
    refuse_batch,
    template_kwargs,
)
from minisgl_core.server.state import ServerState
from minisgl_core.tokenizer.chat_input import (
    ToolsNotRendered,
    check_tools_rendered,
    template_does_not_compile,
    unrendered_tools_fix,
)


class TokenizeBody(StrictModel):
    model: str | None = None
    prompt: Text | None = None
    add_special_tokens: Bool = True
    messages: list[ChatMessage] | None = None
    add_generation_prompt: Bool = True
    continue_final_message: Bool = False
    tools: list[ToolDefinition] | None = None
    #: as the chat route's: template variables only (not a template of the client's, not
    #: return_tensors, truncation...: apply_chat_template's own arguments are the server's)
    chat_template_kwargs: FreeObject | None = None
    #: as the chat route's: the request's own template, where the server trusts requests' templates
    chat_template: Text | None = None

    @model_validator(mode="before")
    @classmethod
    def _not_batched(cls, data: Any) -> Any:
        return refuse_batch(data, "/tokenize")

    @field_validator("chat_template_kwargs")
    @classmethod
    def _free_template_kwargs(cls, kwargs: dict[str, Any]) -> dict[str, Any]:
        return template_kwargs(kwargs)

    @model_validator(mode="after")
    def _template_settings(self) -> TokenizeBody:
        if self.messages is not None:  # (as the chat route checks them)
            chat_template_args(self)
        return self


class DetokenizeBody(StrictModel):
    model: str | None = None
    tokens: list[Int] = Field(min_length=0)


def _encode(
    tokenizer: Any, body: TokenizeBody, messages: list[dict[str, Any]] | None, args: dict[str, Any] | None
) -> list[int]:
    """The body's prompt or its ``messages`` (made ready for the template) rendered with ``args``."""
    if messages is None:
        return list(tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens))
    template = (args or {}).get("chat_template") or getattr(tokenizer, "chat_template", None)
    if not template:
        raise ValueError("this model's tokenizer has no chat_template; start the server with --chat-template")
    args = {"add_generation_prompt": True, **(args or {})}
    ids = _render(tokenizer, messages, args)
    # tools the template drops are refused, as the chat route refuses them (this counted the
    # prompt without them, with a 200)
    check_tools_rendered(
        ids,
        args,
        lambda free: _render_or_none(tokenizer, messages, free),
        unrendered_tools_fix(args, getattr(tokenizer, "chat_template", None)),
    )
    return ids


def _render_or_none(tokenizer: Any, messages: list[dict[str, Any]], args: dict[str, Any]) -> list[int] | None:
    """The rendering without the tools; None where the template cannot render without them (it
    raises: such a template uses them), as ``LLM.chat`` asks it."""
    try:
        return _render(tokenizer, messages, args)
    except ValueError:
        return None


def _render(tokenizer: Any, messages: list[dict[str, Any]], args: dict[str, Any]) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, tokenize=True, **args)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return list(ids)


def tokenize_router(
    state: ServerState, tokenizer: ApiTokenizer, options: ApiOptions | None = None
) -> APIRouter:
    trusted = options is not None and options.trust_request_chat_template
    router = APIRouter()

    @router.post("/tokenize")
    async def tokenize(body: TokenizeBody) -> dict[str, Any]:
        if (body.prompt is None) == (body.messages is None):
            raise APIError(400, "give exactly one of prompt or messages", "prompt")
        state.model.check_name(body.model)
        if body.messages is not None:  # (as the chat route: a prompt renders no template)
            check_request_template(body.chat_template, trusted)
        messages = None if body.messages is None else [m.to_template() for m in body.messages]
        args = None if body.messages is None else chat_template_args(body)
        # (a prompt that cannot fit the context is refused before seconds of tokenizing, as there)
        state.check_prompt_size(body.prompt, messages, args)
        try:
            ids = await tokenizer.run(_encode, body, messages, args)
        except ToolsNotRendered as exc:
            raise APIError(400, str(exc), "tools") from None
        except Exception as exc:  # noqa: BLE001 - a template error is the request's problem
            field = "messages" if body.messages is not None else "prompt"
            if body.messages is not None and body.chat_template is not None:  # the request's template
                raise APIError(
                    400, f"could not render chat_template: {type(exc).__name__}: {exc}", "chat_template"
                ) from exc
            # (unless the server's own template does not compile: said as /v1/chat/completions says it)
            raise APIError(
                400, template_does_not_compile(exc) or f"could not tokenize: {exc}", field
            ) from exc
        return {
            "tokens": ids,
            "count": len(ids),
            "max_model_len": state.model.max_model_len,
        }

    @router.post("/detokenize")
    async def detokenize(body: DetokenizeBody) -> dict[str, Any]:
        state.model.check_name(body.model)
        vocab = state.model.vocab_size
        if any(not 0 <= t < vocab for t in body.tokens):
            raise APIError(400, f"tokens must be token ids in [0, {vocab})", "tokens")
        text = await tokenizer.run(lambda tok: tok.decode(body.tokens))
        # vLLM answers "prompt", SGLang "text": both, so either client reads it
        return {"prompt": text, "text": text}

    @router.get("/version")
    async def version() -> dict[str, str]:
        return {"version": _core_version()}

    return router


def _core_version() -> str:
    # from the installed distribution: importing the package root would pull in the offline LLM
    from importlib.metadata import version

    return version("minisgl-core")
