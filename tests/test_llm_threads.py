"""The offline LLM used from several threads."""

from __future__ import annotations

import threading

from minisgl_core import LLM
from minisgl_core.demo.factories import make_model_dir
from minisgl_core.sampling import SamplingParams


def test_generate_from_two_threads_gives_each_its_own_outputs(tmp_path):
    """Two threads' generate interleaved their steps on one engine: hangs, 'insert_prefix needs one
    slot per token', 'position 6 is past its pages', outputs unlike a call alone. Calls now run
    one after another, each giving what it gives alone."""
    model_dir = make_model_dir(tmp_path / "m", "Qwen3ForCausalLM", max_position_embeddings=1024)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    prompts = {i: [[10 + i, 20 + j, 30, 40 + i] for j in range(3)] for i in range(4)}
    with LLM(model_dir, device="cpu", attn="torch", num_kv_tokens=4096) as llm:
        alone = {
            i: [o.token_ids for o in llm.generate(p, params, use_tqdm=False)] for i, p in prompts.items()
        }
        for _ in range(3):
            results: dict[int, list[list[int]]] = {}
            errors: list[BaseException] = []

            def run(i: int, results: dict = results, errors: list = errors) -> None:
                try:
                    results[i] = [o.token_ids for o in llm.generate(prompts[i], params, use_tqdm=False)]
                except BaseException as exc:  # noqa: BLE001 - reported below
                    errors.append(exc)

            threads = [threading.Thread(target=run, args=(i,)) for i in prompts]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            assert not any(t.is_alive() for t in threads), "a generate call hung"
            assert errors == [] and results == alone
