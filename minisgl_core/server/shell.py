"""The interactive chat shell: a client of the server's streaming chat API, keeping the history.

Commands: ``/reset`` forgets the conversation, ``/exit`` (or Ctrl-D) quits; Ctrl-C stops the reply
being streamed, or clears the prompt; a message starting with "/" is typed with "//" (one "/" is taken off). It also
reads a scripted conversation from a pipe (one user turn per line), and then echoes each turn so
the output reads as a transcript. The exit status is 1 when a turn failed
(an error line in place of the reply) or the server stopped, else 0: a script can tell a
transcript with errors from a clean one. Standard library only (urllib).
"""

from __future__ import annotations

import http.client
import json
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import TextIO

HELP = (
    "minisgl shell: type a message (//... sends one starting with /); /reset clears the history, "
    "/exit or Ctrl-D quits, Ctrl-C stops a reply"
)
#: said where Ctrl-C meets the prompt, which it clears (as Python's and ollama's prompts do)
QUIT_HINT = "/exit or Ctrl-D quits"


class ShellError(RuntimeError):
    pass


def stream_chat(
    url: str,
    api_key: str | None,
    model: str,
    messages: list[dict[str, str]],
    temperature: float | None,
    max_tokens: int | None,
) -> Iterator[str]:
    """The reply's text pieces as the server streams them; temperature None = the model's default,
    max_tokens None = what the context leaves (or the model's default)."""
    body = {
        "model": model,
        "messages": messages,
        "stream": True,
        "temperature": temperature,
        "max_tokens": max_tokens,
    }
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(f"{url}/v1/chat/completions", json.dumps(body).encode(), headers)
    try:
        response = urllib.request.urlopen(request)
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read())["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = str(exc)
        raise ShellError(message) from exc
    except urllib.error.URLError as exc:
        raise ShellError(f"cannot reach the server at {url}: {exc.reason}") from exc
    except OSError as exc:  # reset or closed before the status line (the server went away)
        raise ShellError(f"cannot reach the server at {url}: {exc}") from exc
    try:
        yield from _pieces(response)
    except (OSError, http.client.HTTPException) as exc:  # a reset, IncompleteRead: mid-reply
        raise ShellError(f"the connection to the server was lost mid-reply ({type(exc).__name__})") from exc


def _pieces(response: http.client.HTTPResponse) -> Iterator[str]:
    with response:
        for raw in response:
            line = raw.decode("utf-8").strip()
            if not line.startswith("data: "):
                continue
            data = line.removeprefix("data: ")
            if data == "[DONE]":
                return
            chunk = json.loads(data)
            if "error" in chunk:
                raise ShellError(chunk["error"]["message"])
            for choice in chunk["choices"]:
                if choice["delta"].get("content"):
                    yield choice["delta"]["content"]
    # (the server went away without ending the stream: the reply would read as complete)
    raise ShellError("the reply was cut off: the server closed the stream before its end")


def run_shell(
    url: str,
    api_key: str | None,
    model: str,
    is_failed: Callable[[], bool] = lambda: False,
    *,
    temperature: float | None = None,
    max_tokens: int | None = 512,
    system: str | None = None,
    stdin: TextIO | None = None,
    stdout: TextIO | None = None,
) -> int:
    """Chat until /exit or the end of the input; the exit status: 1 when a turn failed or the
    server stopped (``is_failed``), else 0."""
    stdin = stdin or sys.stdin
    if stdin is sys.stdin and hasattr(stdin, "reconfigure"):
        # bytes that are not UTF-8 arrive as lone surrogates, said below, not a UnicodeDecodeError
        stdin.reconfigure(errors="surrogateescape")
    out = stdout or sys.stdout
    interactive = stdin.isatty()
    start = [{"role": "system", "content": system}] if system else []
    history = list(start)
    turn_failed = False
    if interactive:
        try:
            import readline  # noqa: F401 - line editing and history for input()
        except ImportError:
            pass
        print(HELP, file=out)
    while not is_failed():
        try:
            line = input("you> ") if interactive and stdin is sys.stdin else stdin.readline()
        except EOFError:
            break
        except KeyboardInterrupt:
            if not interactive:
                break
            # (at the prompt it quit, status 0, though the help says Ctrl-C stops a reply: a
            # Ctrl-C meant for a reply that had just ended took the conversation with it)
            print(f"\n({QUIT_HINT})", file=out, flush=True)
            continue
        if not interactive and not line:
            break  # end of the script
        line = line.strip()
        if not line:
            continue
        # (bytes not UTF-8 come as lone surrogates, which the server refused naming a JSON path)
        shown = line.encode("utf-8", "replace").decode()
        if not interactive:
            print(f"you> {shown}", file=out)
        if shown != line:
            print("error: the line is not valid UTF-8 text; not sent", file=out, flush=True)
            turn_failed = True
            continue
        if line in ("/exit", "/quit"):
            break
        if line == "/reset":
            history = list(start)
            print("(history cleared)", file=out, flush=True)
            continue
        if line.startswith("/") and not line.startswith("//"):
            command = line.split()[0]
            # ("/reset now" was an "unknown command /reset")
            known = command in ("/exit", "/quit", "/reset")
            problem = f"{command} takes no arguments" if known else f"unknown command {command}"
            print(f"{problem} (type /{line} to send the line); {HELP}", file=out, flush=True)
            continue
        history.append({"role": "user", "content": line.removeprefix("/") if line.startswith("//") else line})
        reply = ""
        print("assistant> ", end="", file=out, flush=True)
        try:
            for piece in stream_chat(url, api_key, model, history, temperature, max_tokens):
                reply += piece
                print(piece, end="", file=out, flush=True)
        except KeyboardInterrupt:
            print(" [stopped]", end="", file=out)
        except ShellError as exc:
            # (a conversation past the context fails at every turn from then on: say the way out;
            # /reset keeps the system prompt, so it is no way out of one too long on its own)
            hint = ""
            if "context" in str(exc) and len(history) > len(start) + 1:
                hint = " (/reset clears the history)"
            elif "context" in str(exc) and start:
                hint = " (the system prompt, --system, takes part of the context)"
            print(f"\nerror: {exc}{hint}", file=out, flush=True)
            history.pop()
            turn_failed = True
            continue
        print(file=out, flush=True)
        history.append({"role": "assistant", "content": reply})
    # (0 after failed turns told a script its conversation had gone through)
    return 1 if is_failed() or turn_failed else 0
