"""SGLang's and vLLM's flags that minisgl spells otherwise: the command line's error names
minisgl's flag (it was argparse's bare "unrecognized arguments")."""

from __future__ import annotations

import shlex

import pytest

from minisgl_core.cli import _FOREIGN_FLAGS, build_parser, foreign_flag_hints


@pytest.fixture(scope="module")
def parser():
    return build_parser()


def refusal(parser, argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # one line, as every refusal of the command line
    return err


@pytest.mark.parametrize(
    ("given", "says"),
    [
        (
            "--chunked-prefill-size 64",
            "--chunked-prefill-size is SGLang's; minisgl's is --max-prefill-tokens",
        ),
        ("--context-length 4096", "--context-length is SGLang's; minisgl's is --max-context-len"),
        ("--mem-fraction-static 0.8", "--mem-fraction-static is SGLang's; minisgl's is --kv-memory-fraction"),
        ("--attention-backend triton", "--attention-backend is SGLang's; minisgl's is --attn"),
        ("--max-model-len=4096", "--max-model-len is vLLM's; minisgl's is --max-context-len"),
        (
            "--gpu-memory-utilization 0.9",
            "--gpu-memory-utilization is vLLM's; minisgl's is --kv-memory-fraction",
        ),
        # from the offline LLM's table of vLLM's keywords
        ("--tensor-parallel-size 2", "--tensor-parallel-size is vLLM's; minisgl's is --tp"),
        ("--max_num_seqs 8", "--max-num-seqs is vLLM's; minisgl's is --max-running-requests"),
        (
            "--max-num-batched-tokens 512",
            "--max-num-batched-tokens is vLLM's; minisgl's is --max-prefill-tokens",
        ),
        ("--enforce-eager", "--enforce-eager is vLLM's; minisgl's is --cuda-graph-max-bs 0"),
        (
            "--scheduling-policy priority",
            "--scheduling-policy is vLLM's; minisgl's is --policy",
        ),
        ("--trust-remote-code", "--trust-remote-code is vLLM's and SGLang's: minisgl runs no model code"),
    ],
)
def test_a_flag_of_sglang_or_vllm_names_minisgls(parser, capsys, given, says):
    err = refusal(parser, ["serve", "--model", "demo", *shlex.split(given)], capsys)
    assert err.startswith(f"minisgl: error: unrecognized arguments: {given}; {says}"), err


def test_an_unknown_flag_is_refused_as_before(parser, capsys):
    assert (
        refusal(parser, ["serve", "--bogus", "1"], capsys)
        == "minisgl: error: unrecognized arguments: --bogus 1\n"
    )


def test_every_suggested_flag_is_one_serve_takes(parser):
    """Each hint names a flag `minisgl serve` has: none points at a flag renamed or removed since."""
    from minisgl_core.llm import _NOT_NEEDED_OPTIONS, _VLLM_OPTIONS

    serve = next(a for a in parser._actions if a.dest == "command").choices["serve"]
    flags = {option for action in serve._actions for option in action.option_strings}
    foreign = [*_FOREIGN_FLAGS, *("--" + k.replace("_", "-") for k in _VLLM_OPTIONS)]
    hints = foreign_flag_hints(foreign)
    assert len(hints) == len(foreign)
    for hint in hints:
        instead = hint.split("minisgl's is ", 1)[1].split()[0]
        assert instead in flags, hint
    assert foreign_flag_hints(["--" + k.replace("_", "-") for k in _NOT_NEEDED_OPTIONS])
