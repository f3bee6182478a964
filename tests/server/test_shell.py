"""The chat shell answers a scripted conversation, keeping history until /reset."""

from __future__ import annotations

import contextlib
import http.server
import io
import json
import os
import subprocess
import threading
from collections.abc import Iterator

from minisgl_core.sampling import SamplingParams
from minisgl_core.testing.cli_runner import run_cli
from minisgl_core.tokenizer.load import apply_chat_template

SCRIPT = "hello there\nand what about the sea?\n/reset\nhello there\n/exit\nnever read\n"
#: the same conversation ended by end-of-input (Ctrl-D) instead of /exit
SCRIPT_EOF = SCRIPT.split("/exit")[0]
MAX_TOKENS = 4


def expected_transcript(llm, script: str = SCRIPT) -> str:
    """What the shell must print, with each reply computed offline from the same history."""

    def reply(history: list[dict[str, str]]) -> str:
        ids = apply_chat_template(llm.tokenizer, history)
        return llm.generate([ids], SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))[0].text

    lines, history = [], []
    for line in script.splitlines():
        lines.append(f"you> {line}")
        if line == "/exit":
            break
        if line == "/reset":
            history = []
            lines.append("(history cleared)")
            continue
        history.append({"role": "user", "content": line})
        answer = reply(history)
        history.append({"role": "assistant", "content": answer})
        lines.append(f"assistant> {answer}")
    return "\n".join(lines) + "\n"


def run_shell(args: list[str], tmp_path, script: str = SCRIPT) -> subprocess.CompletedProcess:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    return run_cli(["shell", "--temperature", "0", "--max-tokens", str(MAX_TOKENS), *args], input=script, env=env,
                   timeout=180)  # fmt: skip


def test_shell_starts_its_own_server(model_dir, engine_args, llm, tmp_path):
    result = run_shell(["--model", str(model_dir), *engine_args], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected_transcript(llm)
    # while loading it says what it is doing (on stderr: stdout is the conversation)
    said = result.stderr.splitlines()
    loading = next(
        i for i, line in enumerate(said) if line.startswith(f"minisgl shell: loading {model_dir} ")
    )
    assert any(line.startswith(f"minisgl shell: {model_dir.name} ready in ") for line in said[loading + 1 :])
    assert list(tmp_path.glob("minisgl-*")) == []  # its private sockets are gone


def test_shell_attaches_to_a_running_server_and_stops_at_end_of_input(server, llm, tmp_path):
    result = run_shell(["--url", server.url, "--api-key", "test-key"], tmp_path, SCRIPT_EOF)
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected_transcript(llm, SCRIPT_EOF)


def test_shell_takes_an_openai_base_url_ending_in_v1(server, llm, tmp_path):
    """``--url .../v1`` (how OpenAI clients spell a base URL) asked for /v1/v1/models: a 404."""
    for url in (f"{server.url}/v1", f"{server.url}/v1/"):
        result = run_shell(["--url", url, "--api-key", "test-key"], tmp_path, SCRIPT_EOF)
        assert result.returncode == 0, result.stderr
        assert result.stdout == expected_transcript(llm, SCRIPT_EOF)


def _one_shot_server(reply: bytes | list[bytes]):
    """A socket that answers each connection with ``reply`` and closes it (b"": closes at once);
    a list: the i-th connection gets the i-th (the last one from there on)."""
    import socket
    import threading

    replies = list(reply) if isinstance(reply, list) else [reply]
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                answer = replies.pop(0) if len(replies) > 1 else replies[0]
                if answer:
                    conn.sendall(answer)

    threading.Thread(target=serve, daemon=True).start()
    return listener, f"http://127.0.0.1:{listener.getsockname()[1]}"


def test_a_server_gone_mid_reply_or_before_it_is_an_error_line_not_a_traceback():
    """A server killed during a reply cut it off without a word (it read as complete), and the next
    turn ended the shell with a ConnectionResetError traceback."""
    import io
    import re

    from minisgl_core.server.shell import run_shell as shell

    cut = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"
           b'data: {"choices": [{"index": 0, "delta": {"content": "Hel"}}]}\n\n')  # fmt: skip
    # (cut off: the end of the stream, or a reset where the request's bytes were left unread)
    gone = "error: the reply was cut off|error: the connection to the server was lost mid-reply"
    for reply, says in [(cut, gone), (b"", "error: cannot reach the server")]:
        listener, url = _one_shot_server(reply)
        out = io.StringIO()
        try:
            code = shell(url, None, "m", stdin=io.StringIO("hi\nhi again\n"), stdout=out, max_tokens=4)
        finally:
            listener.close()
        assert code == 1 and len(re.findall(says, out.getvalue())) == 2, out.getvalue()
        assert "Traceback" not in out.getvalue()


def test_the_shell_exits_nonzero_after_a_failed_turn():
    """The exit status was 0 with every turn an error: a script could not tell. A turn that
    failed makes it 1, even when the turns after it went through; a clean conversation stays 0."""
    from minisgl_core.server.shell import run_shell as shell

    ok = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"
          b'data: {"choices": [{"index": 0, "delta": {"content": "Hi"}}]}\n\ndata: [DONE]\n\n')  # fmt: skip
    refused = (b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: 38\r\n\r\n"
               b'{"error": {"message": "bad request!"}}')  # fmt: skip
    for replies, code in [([ok, ok], 0), ([refused, ok], 1)]:
        listener, url = _one_shot_server(replies)
        out = io.StringIO()
        try:
            assert shell(url, None, "m", stdin=io.StringIO("hi\nhi again\n"), stdout=out) == code
        finally:
            listener.close()
        assert out.getvalue().count("assistant> Hi\n") == 1 + (code == 0), out.getvalue()
    # (the command line: a server that refuses every connection, as one gone away)
    listener, url = _one_shot_server(b"")
    listener.close()
    result = run_cli(["shell", "--url", url, "--served-model-name", "m"], input="hi\n/reset\n")
    assert result.returncode == 1, result.stderr
    assert "error: cannot reach the server" in result.stdout and "(history cleared)" in result.stdout


def test_a_system_prompt_past_the_context_is_not_hinted_away_by_reset():
    """A --system prompt too long for the context failed every turn with "(/reset clears the
    history)", though /reset keeps it: the hint now names the system prompt there, and /reset
    only where earlier turns take room."""
    from minisgl_core.server.shell import run_shell as shell

    body = b'{"error": {"message": "the prompt exceeds the context length 2048; shorten it"}}'
    refused = (
        b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
        % (len(body), body)
    )
    ok = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"
          b'data: {"choices": [{"index": 0, "delta": {"content": "Hi"}}]}\n\ndata: [DONE]\n\n')  # fmt: skip
    said = "error: the prompt exceeds the context length 2048; shorten it"
    system_hint, reset_hint = (
        " (the system prompt, --system, takes part of the context)",
        " (/reset clears the history)",
    )
    for system, replies, hints in [
        ("long", [refused], [system_hint] * 3),
        (None, [refused], [""] * 3),
        ("short", [ok, refused], [reset_hint, system_hint]),  # (turn 1 answered, turn 2 past it, /reset)
        (None, [ok, refused], [reset_hint, ""]),
    ]:
        listener, url = _one_shot_server(replies)
        out = io.StringIO()
        try:
            code = shell(url, None, "m", system=system, stdin=io.StringIO("hi\nhi\n/reset\nhi\n"), stdout=out)
        finally:
            listener.close()
        errors = [line for line in out.getvalue().splitlines() if line.startswith("error:")]
        assert code == 1 and errors == [said + hint for hint in hints], out.getvalue()


def test_a_system_prompt_not_utf8_is_refused_before_any_turn(capsys):
    """``--system $'\\xff'`` (a lone surrogate in argv) was sent with every turn, and the server
    refused each naming a JSON path ("messages.0.content: invalid text")."""
    from minisgl_core.cli import main

    for args in (["shell", "--url", "http://127.0.0.1:9"], ["serve", "--shell", "--model", "/nonexistent"]):
        assert main([*args, "--system", "ok \udcff"]) == 2
        assert capsys.readouterr().err == (
            "minisgl: error: --system is not valid UTF-8 text (a byte 0xff at character 3): pass text in UTF-8\n"
        )


@contextlib.contextmanager
def fake_server(models: bytes) -> Iterator[http.server.ThreadingHTTPServer]:
    """An HTTP server that answers GET /v1/models with ``models`` and every chat with "Hi"; the
    chat bodies it was sent are kept in ``server.chats``."""
    ok = b'data: {"choices": [{"index": 0, "delta": {"content": "Hi"}}]}\n\ndata: [DONE]\n\n'

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self, body: bytes) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self._answer(models)

        def do_POST(self) -> None:  # noqa: N802
            server.chats.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self._answer(ok)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.chats = []
    server.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def shell_command(*args: str, script: str = "hi\n") -> subprocess.CompletedProcess:
    return run_cli(["shell", *args], input=script, timeout=180)


def test_a_url_that_is_no_minisgl_server_is_one_line_naming_url():
    """A /v1/models answer not JSON was a JSONDecodeError traceback, one listing no model an
    IndexError, a malformed URL a ValueError traceback, a port past 65535 "Connection refused"."""
    for models, says in [
        (b"<html>hello</html>", "answered '<html>hello</html>', not a list of models"),
        (b'{"data": []}', "/v1/models lists no model"),
    ]:
        with fake_server(models) as server:
            result = shell_command("--url", server.url)
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
        assert result.stderr.strip() == result.stderr.strip().splitlines()[0], result.stderr
        assert result.stderr.startswith(f"minisgl shell: --url {server.url}: ") and says in result.stderr
        assert server.chats == []
    for url, says in [
        ("http://[bad", "--url 'http://[bad' is not a URL: Invalid IPv6 URL"),
        ("http://127.0.0.1:99999", "--url 'http://127.0.0.1:99999': the port must be a number from 1 to 65535"),
        # (UnicodeError's traceback from the lookup: a host name part past 63 characters or an empty one)
        ("http://a..b:9", "--url 'http://a..b:9': the host name has a part longer than 63 characters or an "
         "empty one; give the server's address"),
        ("http://" + "a" * 300, f"--url 'http://{'a' * 70}...': the host name has a part longer than 63 "
         "characters or an empty one; give the server's address"),
    ]:  # fmt: skip
        result = shell_command("--url", url)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert result.stderr == f"minisgl: error: {says}\n"


def test_an_empty_url_is_refused_not_taken_as_none():
    """``shell --url ''`` (an unset variable in a script) was taken as --url left out: the shell
    started a server of its own, on the default model (here a model that does not exist, refused
    naming --model)."""
    for url in ("", " "):
        result = shell_command("--url", url, "--model", "/nonexistent")
        assert result.returncode == 2 and result.stderr == (
            "minisgl: error: --url is empty: give the server's address, e.g. http://127.0.0.1:8000, or "
            "leave --url out\n"
        ), result.stderr


def test_a_server_refusing_the_key_is_named_as_such_not_unreachable(server):
    """A missing or wrong key was "cannot reach the server at URL: HTTP Error 401" (found by a
    probe): the server was reached, and the fix is the key."""
    env = {k: v for k, v in os.environ.items() if k != "MINISGL_API_KEY"}
    for key, says in [
        ([], ": give its key with --api-key (or MINISGL_API_KEY)"),
        (["--api-key", "wrong"], ": check --api-key"),
    ]:
        result = run_cli(["shell", "--url", server.url, *key], input="hi\n", timeout=180, env=env)
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
        assert result.stderr == (
            f"minisgl shell: the server at {server.url} answered {server.url}/v1/models with HTTP 401{says}\n"
        ), result.stderr


def test_with_url_the_flags_of_a_server_to_start_are_refused():
    """``shell --url URL --model X --attn Y --tp 7 --port 5`` accepted those and used none of them;
    the ones --url uses (--api-key, --served-model-name, the shell's own) still go through."""
    with fake_server(b'{"data": [{"id": "m"}]}') as server:
        refused = shell_command(
            "--url", server.url, "--model", "/nonexistent", "--attn", "nope", "--tp", "7", "--port", "5"
        )
        one = shell_command("--url", server.url, "--attn", "nope")
        used = shell_command("--url", server.url, "--api-key", "k", "--served-model-name", "x", "--temperature", "0",
                             "--max-tokens", "3", "--system", "be brief", "--log-level", "warning")  # fmt: skip
    assert refused.returncode == 2 and refused.stderr == (
        f"minisgl: error: --model, --attn, --tp, --port have no effect with --url: the server at {server.url} "
        "was started with its own\n"
    )
    assert one.returncode == 2 and one.stderr == (
        f"minisgl: error: --attn has no effect with --url: the server at {server.url} was started with its own\n"
    )
    assert used.returncode == 0 and used.stdout == "you> hi\nassistant> Hi\n", used.stderr
    assert [chat["model"] for chat in server.chats] == ["x"]


#: the demo model with a context too short for the shell's old fixed 512-token replies
SHORT_CONTEXT = ["--model", "demo", "--device", "cpu", "--max-context-len", "256", "--temperature", "0"]


def test_without_max_tokens_a_reply_gets_what_the_context_leaves(monkeypatch):
    """The shell asked for 512 tokens at every turn: with a context of 256 every turn failed
    ("prompt + max_tokens (512) exceeds the context length 256"). Unset, it sends none: its own
    server caps a reply at 512, or at what the context leaves when that is less."""
    from minisgl_core.cli import build_parser
    from minisgl_core.server import launcher

    result = shell_command(*SHORT_CONTEXT)
    assert result.returncode == 0 and "error" not in result.stdout, result.stdout + result.stderr
    reply = result.stdout.removeprefix("you> hi\nassistant> ")
    assert reply != result.stdout and reply.strip(), result.stdout
    with fake_server(b'{"data": [{"id": "m", "max_model_len": 256}]}') as server:
        result = shell_command("--url", server.url)
    assert result.returncode == 0, result.stderr
    assert [chat["max_tokens"] for chat in server.chats] == [None]
    # (its own server caps a reply at 512: its model's default max_tokens)
    started = []
    monkeypatch.setattr(launcher, "serve", lambda opts, plugins, foreground: started.append(opts) or 0)
    args = build_parser().parse_args(["shell", *SHORT_CONTEXT, "--log-level", "warning"])
    assert args.func(args) == 0
    assert started[0].runtime.sampling_defaults["max_tokens"] == 512


def test_max_tokens_past_the_context_is_refused_before_anything_loads():
    """``--max-tokens 100000`` was accepted, the model loaded, and every turn failed."""
    result = shell_command(*SHORT_CONTEXT, "--max-tokens", "100000")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "loading" not in result.stderr and result.stdout == ""
    assert result.stderr.splitlines()[-1].startswith(
        "minisgl: error: --max-tokens 100000 leaves no room for a prompt in the context length 256 of "
    )
    with fake_server(b'{"data": [{"id": "m", "max_model_len": 256}]}') as server:
        result = shell_command("--url", server.url, "--max-tokens", "256")
    assert result.returncode == 2 and server.chats == []
    assert result.stderr == (
        f"minisgl: error: --max-tokens 256 leaves no room for a prompt in the context length 256 of the "
        f"server at {server.url}; lower --max-tokens, or leave it unset (a reply then gets what the context "
        "leaves)\n"
    )


def test_a_line_starting_with_two_slashes_is_sent_with_one():
    """A message starting with "/" ("/usr/bin is a dir?") could not be sent: every such line was an
    unknown command. An unknown command now says how, and "//..." sends it with one "/" taken off."""
    from minisgl_core.server.shell import HELP
    from minisgl_core.server.shell import run_shell as shell

    out = io.StringIO()
    with fake_server(b'{"data": [{"id": "m"}]}') as server:
        code = shell(
            server.url, None, "m", stdin=io.StringIO("/usr/bin is a dir?\n//usr/bin is a dir?\n"), stdout=out
        )
    assert code == 0
    assert out.getvalue() == (
        "you> /usr/bin is a dir?\n"
        f"unknown command /usr/bin (type //usr/bin is a dir? to send the line); {HELP}\n"
        "you> //usr/bin is a dir?\nassistant> Hi\n"
    )
    assert [chat["messages"] for chat in server.chats] == [
        [{"role": "user", "content": "/usr/bin is a dir?"}]
    ]
    assert "//" in HELP


def test_a_command_with_arguments_says_it_takes_none():
    """``/reset now`` said "unknown command /reset", which HELP lists; neither it nor ``/exit now``
    runs (the line may have been meant as a message: it says how to send it)."""
    from minisgl_core.server.shell import HELP
    from minisgl_core.server.shell import run_shell as shell

    out = io.StringIO()
    with fake_server(b'{"data": [{"id": "m"}]}') as server:
        code = shell(
            server.url, None, "m", stdin=io.StringIO("/reset now\n/exit now\n/quit 1\nhi\n"), stdout=out
        )
    assert code == 0
    assert out.getvalue() == (
        f"you> /reset now\n/reset takes no arguments (type //reset now to send the line); {HELP}\n"
        f"you> /exit now\n/exit takes no arguments (type //exit now to send the line); {HELP}\n"
        f"you> /quit 1\n/quit takes no arguments (type //quit 1 to send the line); {HELP}\n"
        "you> hi\nassistant> Hi\n"
    )
    assert [chat["messages"] for chat in server.chats] == [[{"role": "user", "content": "hi"}]]


def test_a_line_not_utf8_is_an_error_line_not_sent():
    """A line of bytes not UTF-8 was sent as lone surrogates, and the server's refusal named a JSON
    path ("messages.2.content: invalid text: a lone UTF-16 surrogate"); with stdin strict, it was a
    UnicodeDecodeError traceback. It is now an error line, not sent, and the exit status 1."""
    for strict in (False, True):
        env = {**os.environ, **({"PYTHONIOENCODING": "utf-8:strict"} if strict else {})}
        with fake_server(b'{"data": [{"id": "m"}]}') as server:
            result = run_cli(["shell", "--url", server.url], input=b"caf\xe9\nhi\n", env=env, text=False)
        assert result.returncode == 1 and b"Traceback" not in result.stderr, result.stderr
        assert result.stdout.decode() == (
            "you> caf?\nerror: the line is not valid UTF-8 text; not sent\nyou> hi\nassistant> Hi\n"
        )
        assert [chat["messages"] for chat in server.chats] == [[{"role": "user", "content": "hi"}]]


def test_ctrl_c_at_the_prompt_clears_it_and_the_shell_goes_on():
    """Ctrl-C at an empty prompt quit the shell with status 0, though its help says Ctrl-C stops a
    reply: a Ctrl-C meant for a reply that had just ended took the conversation with it."""
    import os
    import pty
    import select
    import signal
    import sys
    import time

    def read_until(fd: int, text: bytes, seen: bytearray, timeout: float = 120.0) -> None:
        end = time.monotonic() + timeout
        while text not in seen:
            assert time.monotonic() < end, bytes(seen)
            if select.select([fd], [], [], 1.0)[0]:
                try:
                    seen += os.read(fd, 4096)
                except OSError:  # the child's side closed
                    break
        assert text in seen, bytes(seen)

    models = b'{"data": [{"id": "m"}]}'
    with fake_server(models) as server:
        pid, fd = pty.fork()
        if pid == 0:  # the child: a terminal's foreground process, SIGINT at its default
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.execv(sys.executable, [sys.executable, "-m", "minisgl_core", "shell", "--url", server.url])
        seen = bytearray()
        try:
            read_until(fd, b"you> ", seen)
            # Ctrl-C at the prompt; again while unanswered: a SIGINT that lands between readline's
            # prompt and its wait for a key is only seen at the next key (CPython's readline)
            for _ in range(24):
                time.sleep(0.5)
                os.write(fd, b"\x03")
                try:
                    read_until(fd, b"(/exit or Ctrl-D quits)", seen, timeout=5.0)
                    break
                except AssertionError:
                    continue
            assert b"(/exit or Ctrl-D quits)" in seen, bytes(seen)
            del seen[: seen.rindex(b"(/exit or Ctrl-D quits)")]  # (the prompt after it may be here)
            read_until(fd, b"you> ", seen)
            os.write(fd, b"hi\r")
            read_until(fd, b"assistant> Hi", seen)
            read_until(fd, b"you> ", seen)
            status = None
            for _ in range(24):  # Ctrl-D quits (again while it has not: the same race as Ctrl-C's)
                time.sleep(0.5)
                os.write(fd, b"\x04")
                for _ in range(50):
                    done, status = os.waitpid(pid, os.WNOHANG)
                    if done:
                        break
                    time.sleep(0.1)
                if done:
                    break
            assert done, bytes(seen)
        finally:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0
    assert len(server.chats) == 1


def test_ctrl_c_while_the_shell_loads_the_model_ends_it_with_status_130(model_dir, engine_args):
    """Ctrl-C while ``minisgl shell`` started its server (the workers loading the model) ended it
    with status 0, as a server's stop; 130 (128 + SIGINT) now, as every other command's."""
    import signal
    import sys
    import time

    from minisgl_core.testing.live_server import child_pids

    proc = subprocess.Popen(
        [sys.executable, "-m", "minisgl_core", "shell", "--model", str(model_dir), *engine_args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # (as from a terminal)
    )
    try:
        deadline = time.monotonic() + 60
        while not child_pids(proc.pid):  # the server's workers started: it is loading
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "ready in" not in err and out == "", err
