"""The model's generation_config.json reaches HTTP requests that leave a sampling field unset.

A copy of the tiny model whose generation_config.json says temperature 0 (greedy) and
max_new_tokens 6 is served: requests without a temperature must then be greedy whatever their
seed (and equal an explicit temperature 0), while an explicit temperature still samples. The
session server (same weights, no sampling defaults) is the control: there an unset temperature
means OpenAI's 1.0, so seeded requests differ.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from minisgl_core.testing.cli_runner import run_cli

from .conftest import API_KEY, ENGINE_ARGS

PROMPT = [11, 42, 7, 99, 5]
SEEDS = (1, 2, 3, 4)


@pytest.fixture(scope="module")
def greedy_model_dir(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    copy = tmp_path_factory.mktemp("greedy") / model_dir.name
    shutil.copytree(model_dir, copy)
    gen = json.loads((copy / "generation_config.json").read_text())
    gen |= {"temperature": 0.0, "max_new_tokens": 6, "typical_p": 0.9}
    # and an end-of-sequence id the model cannot produce: dropped, with one warning
    vocab = json.loads((copy / "config.json").read_text())["vocab_size"]
    eos = gen.get("eos_token_id")
    gen["eos_token_id"] = [*(eos if isinstance(eos, list) else [eos] if eos is not None else []), vocab]
    (copy / "generation_config.json").write_text(json.dumps(gen))
    return copy


@pytest.fixture(scope="module")
def greedy_client(start_server, greedy_model_dir: Path):
    import openai

    server = start_server(["--model", str(greedy_model_dir), "--api-key", API_KEY, *ENGINE_ARGS])
    assert (
        "requests' unset sampling fields take the model's defaults: temperature=0.0 max_tokens=6"
        in server.log()
    )
    # (the tokenizer worker read the ids too and logged it a second time)
    assert server.log().count("are outside the vocabulary of") == 1, server.log()
    assert server.log().count("which minisgl does not implement") == 1, server.log()
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


def _completion(client, model: str, **fields) -> tuple[tuple[str, ...], str, int]:
    """(the output's tokens as text, finish reason, completion tokens) of one completion of PROMPT."""
    out = client.completions.create(
        model=model, prompt=PROMPT, logprobs=0, extra_body={"ignore_eos": True}, **fields
    )
    choice = out.choices[0]
    return tuple(choice.logprobs.tokens), choice.finish_reason, out.usage.completion_tokens


def test_unset_temperature_takes_the_models_greedy_default(greedy_client, greedy_model_dir: Path) -> None:
    name = greedy_model_dir.name
    greedy = _completion(greedy_client, name, temperature=0, max_tokens=6)
    unset = [_completion(greedy_client, name, seed=seed, max_tokens=6) for seed in SEEDS]
    assert all(result == greedy for result in unset)
    # an explicit temperature wins over the model's default: seeded samples leave the greedy path
    sampled = [_completion(greedy_client, name, seed=seed, temperature=1.5, max_tokens=6) for seed in SEEDS]
    assert any(result[0] != greedy[0] for result in sampled)


def test_unset_max_tokens_takes_the_models_max_new_tokens(greedy_client, greedy_model_dir: Path) -> None:
    name = greedy_model_dir.name
    _, reason, used = _completion(greedy_client, name)
    assert (reason, used) == ("length", 6)
    _, reason, used = _completion(greedy_client, name, max_tokens=9)
    assert (reason, used) == ("length", 9)


def test_chat_and_native_routes_take_the_defaults_too(greedy_client, greedy_model_dir: Path) -> None:
    import httpx

    name = greedy_model_dir.name
    messages = [{"role": "user", "content": "hello there"}]
    explicit = greedy_client.chat.completions.create(
        model=name, messages=messages, temperature=0, max_tokens=6
    )
    for seed in SEEDS[:2]:
        unset = greedy_client.chat.completions.create(model=name, messages=messages, seed=seed)
        assert unset.choices[0].message.content == explicit.choices[0].message.content
    url = str(greedy_client.base_url).removesuffix("/v1/")
    bodies = [
        {"input_ids": PROMPT, "sampling_params": {"seed": seed, "ignore_eos": True}} for seed in SEEDS[:2]
    ] + [
        {"input_ids": PROMPT, "sampling_params": {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}}
    ]
    outputs = [
        httpx.post(
            f"{url}/generate", json=body, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120
        ).json()
        for body in bodies
    ]
    assert len({tuple(out["output_ids"]) for out in outputs}) == 1, outputs
    assert all(out["meta_info"]["completion_tokens"] == 6 for out in outputs), outputs


def test_without_model_defaults_an_unset_temperature_samples(client, model_name: str) -> None:
    """The control: the same weights without sampling defaults sample at OpenAI's temperature 1."""
    greedy = _completion(client, model_name, temperature=0, max_tokens=6)
    unset = [_completion(client, model_name, seed=seed, max_tokens=6) for seed in SEEDS]
    assert any(result[0] != greedy[0] for result in unset)
    assert unset[0] == _completion(client, model_name, seed=SEEDS[0], max_tokens=6)  # seeded: reproducible


def test_bad_generation_config_fails_in_one_line(model_dir: Path, tmp_path: Path) -> None:
    proc = run_cli(["serve", "--model", str(model_dir), "--port", "0", "--generation-config",
                    str(tmp_path / "nowhere"), *ENGINE_ARGS])  # fmt: skip
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert errors == [f"minisgl: error: --generation-config {tmp_path / 'nowhere'}: no generation_config.json "
                      "there; give a folder holding one, or one of auto, vllm, none"]  # fmt: skip


@pytest.mark.parametrize(
    "file, text, says",
    [
        ("generation_config.json", "{not json", "generation_config.json is not JSON ("),
        (
            "config.json",
            None,
            "config.json: eos_token_id must be a token id (an integer >= 0) or a list of them, got '2'",
        ),
    ],
)
def test_a_model_file_the_engine_cannot_use_fails_in_one_line_under_every_setting(
    model_dir: Path, tmp_path: Path, file: str, text: str | None, says: str
) -> None:
    """The end-of-sequence ids are read whatever --generation-config says: with ``none`` a broken
    generation_config.json, and under every setting a bad eos_token_id, were the scheduler's
    tracebacks after the weights loaded (a review's find); now one line before anything starts."""
    copy = tmp_path / "model"
    shutil.copytree(model_dir, copy)
    if text is None:
        config = json.loads((copy / file).read_text())
        text = json.dumps({**config, "eos_token_id": "2"})
    (copy / file).write_text(text)
    for setting in ("auto", "none"):
        proc = run_cli(
            ["serve", "--model", str(copy), "--port", "0", "--generation-config", setting, *ENGINE_ARGS]
        )
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        errors = [line for line in proc.stderr.splitlines() if "error" in line]
        assert len(errors) == 1 and errors[0].startswith(f"minisgl: error: {copy / file}"), errors
        assert says in errors[0] and errors[0].endswith(
            "; fix it, or remove it" if text.startswith("{not") else "; fix it, or remove the key"
        ), errors


def test_a_bad_generation_config_file_names_the_flag_and_the_way_out(model_dir: Path, tmp_path: Path) -> None:
    """A file that is not JSON (or nested too deep to decode), JSON that is not an object, and a bad default in the user's own
    file said only the file's path and what was wrong (the last blamed "the model's" config), and
    an empty value was reported as '.', the working directory."""
    from minisgl_core.checkpoint.generation_defaults import GenerationConfigError, load_sampling_defaults

    way_out = "fix it, or give --generation-config auto (the model's own) or --generation-config none"
    cases = {
        "bad": ("{bad", "is unreadable ("),
        "list": ("[1, 2]", "must hold a JSON object, got list; "),
        # (nested past the JSON decoder's recursion limit: a RecursionError traceback)
        "deep": ("[" * 100_000 + "]" * 100_000, "is unreadable (maximum recursion depth exceeded"),
    }
    for name, (text, says) in cases.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "generation_config.json").write_text(text)
        with pytest.raises(GenerationConfigError) as err:
            load_sampling_defaults(model_dir, str(tmp_path / name))
        message = str(err.value)
        assert message.startswith(f"--generation-config {tmp_path / name}: ") and says in message, message
        assert message.endswith(way_out), message
    (tmp_path / "hot").mkdir()
    (tmp_path / "hot" / "generation_config.json").write_text(json.dumps({"temperature": "hot"}))
    with pytest.raises(
        GenerationConfigError,
        match="^" + re.escape(f"--generation-config {tmp_path / 'hot'} has an invalid default: "),
    ):
        load_sampling_defaults(model_dir, str(tmp_path / "hot"))
    with pytest.raises(GenerationConfigError, match="^--generation-config '' is empty; give a folder"):
        load_sampling_defaults(model_dir, "")
    # a name too long to look up was an OSError traceback
    with pytest.raises(GenerationConfigError, match=": no generation_config.json there; give a folder"):
        load_sampling_defaults(model_dir, "a" * 5000)
