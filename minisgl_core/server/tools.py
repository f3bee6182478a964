"""What a chat request's ``tools`` and ``tool_choice`` mean for its output.

``none``: plain content. ``auto``: the model may call tools in its own format, read back by the
server's ``--tool-call-parser``. ``required`` and a named function: the output is forced through a
grammar (a JSON schema, enforced by the grammar backend) to be a JSON array of calls
``[{"name": ..., "arguments": {...}}]`` whose arguments follow each function's ``parameters``
schema; :class:`ForcedToolCallParser` reads that array back, whatever the model's own format.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from minisgl_core.api import (
    JsonToolCallParser,
    ScannedCall,
    ToolParser,
    scan_tool_call,
)
from minisgl_core.sampling import cut, short_repr
from minisgl_core.server.errors import APIError
from minisgl_core.server.schemas import ChatCompletionRequest, FunctionDefinition


class ForcedToolCallParser(JsonToolCallParser):
    """The array of calls that ``required`` / a named ``tool_choice`` forces.

    The grammar makes the output this array, so none of it is content, even when max_tokens or a
    stop string cuts it off: a call cut off part-way is a call with its arguments so far once its
    name is complete (as every JsonToolCallParser does). Cut off before that, the first call is
    still certain when one function is offered (a named ``tool_choice``): it is that function's
    call with arguments ``""`` so far, as vLLM answers a named function cut short; any other call
    cut off before its name is dropped (where a parser of the model's own format gives it back as
    content).
    """

    leading_only = True
    list_open = "["
    list_close = "]"
    separator = ","

    def _lead(self, final: bool) -> bool:
        if final and self.buffer.strip() in ("", self.list_open):  # cut off before the first call
            self.buffer = ""
            return self._cut_before_a_name()
        return super()._lead(final)

    def _call(self, final: bool) -> bool:
        if final:
            scan = scan_tool_call(self.buffer, 0, self.arguments_keys)
            if scan.status == "partial" and scan.name is None:  # ended before its name is complete
                self.buffer = ""
                return self._cut_before_a_name()
        return super()._call(final)

    def _cut_before_a_name(self) -> bool:
        if not self.calls_sent and len(self.offered_names) == 1:  # the one function a named tool_choice calls
            (name,) = self.offered_names
            self._send(ScannedCall("partial", name))
        return self._give_up()


#: a function given no ``parameters`` takes none (OpenAI: "omitting parameters defines a function
#: with an empty parameter list"): the arguments ``{}``, where ``{"type": "object"}`` let
#: llguidance write any object and xgrammar ``{}``
NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass(frozen=True)
class ToolPlan:
    #: reads tool calls out of each choice's text; None = the text is plain content
    parser: type[ToolParser] | None = None
    tools: list[dict[str, Any]] = field(default_factory=list)
    #: GrammarSpec fields (a dict: it travels to the scheduler as msgpack) forcing the calls
    grammar: dict[str, str] | None = None
    #: parallel_tool_calls false: at most one call per choice
    single_call: bool = False
    #: TokenizeRequest.grammar_parts: each forced function's parameters, which a grammar error is
    #: about when they fail alone (the tool's fault, not tool_choice's)
    grammar_parts: list[list[str]] = field(default_factory=list)


def plan_tools(body: ChatCompletionRequest, tool_parser: type[ToolParser] | None) -> ToolPlan:
    first_of: dict[str, int] = {}
    #: each tool's parameters as a forced call follows them (checked for every tool choice)
    arguments = [_arguments_schema(tool.function, i) for i, tool in enumerate(body.tools or ())]
    for i, tool in enumerate(body.tools or ()):
        # a call names its function: with two of one name, which parameters would it follow?
        j = first_of.setdefault(tool.function.name, i)
        if j != i:
            raise APIError(
                400,
                f"tools.{i} and tools.{j} are both named {short_repr(tool.function.name)}: "
                "function names must be unique",
                f"tools.{i}.function.name",
            )
    choice = body.tool_choice if body.tool_choice is not None else ("auto" if body.tools else "none")
    if choice not in ("none", "auto") and not body.tools:
        raise APIError(400, "tool_choice needs tools: give the functions the model may call", "tool_choice")
    if choice == "none" or not body.tools:
        return ToolPlan()
    tools = [t.model_dump(exclude_none=True) for t in body.tools]
    single = not body.parallel_tool_calls
    if choice == "auto":
        if tool_parser is None:
            raise APIError(
                400,
                "tool_choice 'auto' needs the server started with --tool-call-parser NAME (see "
                "`minisgl plugins`); or force calls with tool_choice 'required' or a named function",
                "tool_choice",
            )
        return ToolPlan(tool_parser, tools, single_call=single)
    functions = list(enumerate(t.function for t in body.tools))
    if choice == "required":
        calls = [_call_schema(f, i) for i, f in functions]
        schema = {"type": "array", "items": {"anyOf": calls}, "minItems": 1}
        if single:
            schema["maxItems"] = 1
    else:
        name = choice.function.name  # type: ignore[union-attr]
        named = [(i, f) for i, f in functions if f.name == name]
        if not named:
            known = ", ".join(short_repr(f.name) for _, f in functions[:8]) + (
                ", ..." if len(functions) > 8 else ""
            )
            raise APIError(
                400,
                f"tool_choice names {short_repr(name)}, which is not among the tools ({known})",
                "tool_choice",
            )
        functions = named[:1]
        tools = [tools[named[0][0]]]  # the answer's parser reads calls of this function only
        schema = {
            "type": "array",
            "items": _call_schema(named[0][1], named[0][0]),
            "minItems": 1,
            "maxItems": 1,
        }
        single = True
    schema["$defs"] = {_parameters_key(i): _scoped(arguments[i], i) for i, _ in functions}
    grammar = {"kind": "json_schema", "value": json.dumps(schema)}
    parts = [
        [
            f"tools.{i}.function.parameters",
            f"the parameters of function {short_repr(f.name)}, which the calls tool_choice forces "
            "must follow, do not compile",
            json.dumps(arguments[i]),
        ]
        for i, f in functions
    ]
    return ToolPlan(ForcedToolCallParser, tools, grammar, single, parts)


#: keywords that let values other than objects through where ``type`` is absent at the top
_WIDENING = ("anyOf", "oneOf", "allOf", "$ref", "$dynamicRef", "$recursiveRef", "const", "enum", "not", "if")


def _arguments_schema(function: FunctionDefinition, index: int) -> dict[str, Any]:
    """What a forced call's arguments follow: the function's ``parameters`` taken for objects only.
    A call's arguments are a JSON object, so ``parameters`` must describe one (as OpenAI requires):
    type ``object``; a list of types naming it (the others dropped); or no type and no keyword that
    admits other values (type ``object`` added: alone, such a schema takes any JSON value). Anything
    else forced arguments no parser takes for a call: they came back as content, or as a call to
    the wrong function."""
    parameters = function.parameters or NO_PARAMETERS
    kind = parameters.get("type")
    if kind == "object":
        return parameters
    widening = [key for key in _WIDENING if key in parameters]
    if (isinstance(kind, list) and "object" in kind) or (kind is None and not widening):
        return {**parameters, "type": "object"}
    if kind is None:
        got, fix = f"{widening[0]!r} with no type", 'add "type": "object" beside it'
    else:
        got, fix = f"type {cut(json.dumps(kind))}", "put the value in a property"
    raise APIError(
        400,
        f"the parameters of function {short_repr(function.name)} must be a JSON Schema of type 'object' (a "
        f"call's arguments are a JSON object), got {got}; {fix}",
        f"tools.{index}.function.parameters",
    )


def _call_schema(function: FunctionDefinition, index: int) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "name": {"type": "string", "const": function.name},
            "arguments": {"$ref": f"#/$defs/{_parameters_key(index)}"},
        },
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def _parameters_key(index: int) -> str:
    """Where tool ``index``'s parameters sit in the forced schema's ``$defs`` (no character a JSON
    pointer escapes; grammar errors name this path, so it says which tool)."""
    return f"tools.{index}.parameters"


#: keywords whose values are data, not schemas: a ``$ref`` in them is a value and stays as it is
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples", "example"})
#: keywords that map names (a property's, a definition's...) to schemas
_SCHEMA_MAPS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies"}
)


def _scoped(schema: Any, index: int) -> Any:
    """A copy of tool ``index``'s parameters whose local ``$ref`` s (``#``, ``#/...``) point into
    its place in the forced schema's ``$defs``: resolved against the wrapper, ``#/$defs/A`` would
    look for the wrapper's own ``$defs`` and ``#`` would be the whole array of calls. Another
    document's reference and an anchor (``#name``) stay as they are. Keywords of no standard are
    walked as schemas too, since a ``$ref`` may point into them (``#/components/schemas/A``)."""
    if isinstance(schema, list):
        return [_scoped(item, index) for item in schema]
    if not isinstance(schema, dict):
        return schema
    scoped: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "$ref" and isinstance(value, str) and (value == "#" or value.startswith("#/")):
            scoped[key] = f"#/$defs/{_parameters_key(index)}{value[1:]}"
        elif key in _DATA_KEYWORDS:
            scoped[key] = value
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            scoped[key] = {name: _scoped(sub, index) for name, sub in value.items()}
        else:
            scoped[key] = _scoped(value, index)
    return scoped
