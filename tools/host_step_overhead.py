"""The engine's host time per decode step on the CPU, with the model's forward timed apart.

A tiny random model (one layer, hidden 64) on the CPU, ``--batch`` requests decoding together
(short prompts, ``ignore_eos``, overlap on as on a GPU): what is left of a step once the forward
(the attention's plan and the model) is taken out is the work the host also does on a GPU every
step: planning the batch (policy, KV pages, the step's host arrays and their copy), the sampling
parameters, stop checks and outputs.

    python tools/host_step_overhead.py --batch 128 --steps 200 [--repeat 5] [--profile out.prof]
    python tools/host_step_overhead.py --batch 256 --stub-forward    # no forward at all

Prints, per decode step (µs): the step's wall and CPU time (the process's, less affected by busy
neighbours), the forward's, and the difference (median over the repeats, with min and max). With
``--stub-forward`` the forward is skipped (each step's logits are a fixed random tensor), so the
step is the host's work and the CPU's sampling alone. The timed steps are decode steps only.
Run it with another tree first on PYTHONPATH for that tree's figure.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=128, help="requests decoding together")
    parser.add_argument("--steps", type=int, default=200, help="decode steps timed a repeat")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--page-size", type=int, default=16, help="KV page size (16: a GPU's default)")
    parser.add_argument("--model", help="a model directory (default: a tiny random Qwen3, built once)")
    parser.add_argument(
        "--stub-forward",
        action="store_true",
        help="skip the forward: each step's logits are a fixed random tensor (no device work but the sampling's)",
    )
    parser.add_argument("--profile", help="write cProfile stats of the timed steps to this file")
    args = parser.parse_args()

    import torch

    from minisgl_core.demo.factories import make_model_dir
    from minisgl_core.sampling import SamplingParams
    from minisgl_core.testing.engine_run import cpu_llm

    torch.set_num_threads(1)
    model = args.model
    if model is None:
        model = Path(tempfile.gettempdir()) / "minisgl-host-step-model"
        if not (model / "config.json").exists():
            make_model_dir(model, num_hidden_layers=1, intermediate_size=64)
    llm = cpu_llm(model, max_running_requests=args.batch, page_size=args.page_size, overlap=True)
    engine = llm.engine
    forward = [0.0]
    prepare = engine.runner.prepare

    fixed_logits = torch.randn(args.batch, engine.runner.vocab_size)

    def stub_prepare(batch):  # fixed logits, one row a request
        return lambda: fixed_logits[: batch.logits_indices.numel()]

    def timed_prepare(batch):  # the forward's host time: the attention's plan and the model
        if args.stub_forward:
            return stub_prepare(batch)
        started = time.perf_counter()
        run = prepare(batch)
        forward[0] += time.perf_counter() - started

        def timed_run():
            started = time.perf_counter()
            logits = run()
            forward[0] += time.perf_counter() - started
            return logits

        return timed_run

    engine.runner.prepare = timed_prepare
    max_tokens = args.steps + 8
    params = SamplingParams(temperature=args.temperature, max_tokens=max_tokens, ignore_eos=True, seed=None)
    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
    totals, forwards, cpus = [], [], []
    for repeat in range(args.repeat + 1):  # the first is a warm-up
        rid0 = repeat * args.batch
        for i in range(args.batch):
            prompt = [1 + (i * 31 + j * 7) % 900 for j in range(8 + i % 8)]
            engine.add_request(rid0 + i, prompt, engine.admit(prompt, params))
        while engine.scheduler.waiting:  # the prefills, and the first decodes
            engine.step()
        for _ in range(2):
            engine.step()
        forward[0] = 0.0
        if profiler is not None and repeat:
            profiler.enable()
        started, cpu_started = time.perf_counter(), time.process_time()
        for _ in range(args.steps):
            engine.step()
        total, cpu = time.perf_counter() - started, time.process_time() - cpu_started
        if profiler is not None:
            profiler.disable()
        if repeat:
            totals.append(total / args.steps * 1e6)
            forwards.append(forward[0] / args.steps * 1e6)
            cpus.append(cpu / args.steps * 1e6)
        while engine.has_work:
            engine.step()
    host = [t - f for t, f in zip(totals, forwards)]
    rows = [("step", totals), ("step cpu", cpus)]
    rows += [] if args.stub_forward else [("forward", forwards), ("host", host)]
    for name, values in rows:
        print(
            f"batch {args.batch} {name:8s} µs/step: median {statistics.median(values):8.1f}  "
            f"min {min(values):8.1f}  max {max(values):8.1f}"
        )
    if profiler is not None:
        profiler.dump_stats(args.profile)
    llm.close()


if __name__ == "__main__":
    main()
