"""The engine's host time per decode step on the CPU, with the model's forward timed apart.

A tiny random model (one layer, hidden 64) on the CPU, ``--batch`` requests decoding together
(short prompts, ``ignore_eos``, overlap on and page size 16 as on a GPU): what is left of a step
once the forward (the attention's plan and the model) is taken out is the work the host also does
on a GPU every step: planning the batch (policy, KV pages, the step's host arrays and their copy),
the sampling parameters, stop checks and outputs.

    python tools/host_step_overhead.py --batch 128 [--steps 20 --windows 10 --repeat 3] [--profile out.prof]
    python tools/host_step_overhead.py --batch 256 --stub-forward    # no forward at all
    python tools/host_step_overhead.py --batch 256 --stub-forward --against /tmp/base \\
        --swap scheduler.scheduler:Scheduler.process,engine.engine:Engine._launch

Prints, per decode step (µs): the step's wall and CPU time (the process's, less affected by busy
neighbours), the forward's, and the difference: median, min and max over the timed windows (on a
busy machine the min is the steadiest figure). With ``--stub-forward`` the forward is skipped
(each step's logits are a fixed random tensor), so the step is the host's work and the CPU's
sampling alone. The timed steps are decode steps only.

``--against TREE --swap MODULE:CLASS.METHOD,...`` (or ``MODULE:FUNCTION``) compares two versions
of the core in one process: the windows alternate in pairs (ABBA...) between the methods named as
this tree has them and as TREE has them (its modules loaded under other names), so a busy machine
slows both alike; it prints both CPU figures and the ratio this/TREE of each pair. Another tree's
whole core is timed by running the tool with that tree first on PYTHONPATH (whole runs of one
tree swung 1.5-3.4 ms a step at batch 256 on the shared dev CPU: compare within one process).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path


def swaps(tree: str, names: str) -> list[tuple[object, str, object, object]]:
    """(class or module, name, this tree's function, ``tree``'s) for each ``module:Class.method``
    or ``module:function`` of ``names`` (modules under minisgl_core, e.g.
    ``scheduler.kv:KVManager.available_pages``). A function is swapped where ``module``'s code
    looks it up, and ``tree``'s version is taken from the module that defines it
    (``scheduler.scheduler:rows_to_device``: runner/sampler.py's, as the scheduler calls it).
    A method only one tree has (one that the change removed, or added) is None on the other
    side: :func:`put` removes it while that side is timed. ``tree``'s functions see this tree's
    imports, and their own module's classes: a method that makes objects of a class its module
    defines (``Scheduler._build_decode``, a ScheduledBatch) hands the other tree's code objects
    of another class, so such a method is left out (the other tree's code reading them failed)."""
    out = []
    for name in names.split(","):
        module, _, attr = name.partition(":")
        cls_name, _, method = attr.rpartition(".")
        ours = importlib.import_module(f"minisgl_core.{module}")
        ours = getattr(ours, cls_name) if cls_name else ours
        home = getattr(vars(ours).get(method), "__module__", None) if not cls_name else ours.__module__
        home = home or ours.__name__  # (a function only the other tree has: this module's)
        theirs_module = _load(tree, home.removeprefix("minisgl_core."))
        theirs = getattr(theirs_module, cls_name) if cls_name else theirs_module
        mine, other = vars(ours).get(method), vars(theirs).get(method)
        if mine is None and other is None:
            raise SystemExit(f"--swap {name}: neither tree has it")
        out.append((ours, method, mine, other))
    return out


def put(owner: object, name: str, function: object) -> None:
    """``owner.name = function``; with None, ``name`` removed (absent from the tree timed)."""
    if function is not None:
        setattr(owner, name, function)
    elif name in vars(owner):
        delattr(owner, name)


def _load(tree: str, module: str):
    """``tree``'s minisgl_core.``module`` under another name (its own imports are this tree's)."""
    alias = f"_against_{module.replace('.', '_')}"
    if alias not in sys.modules:
        path = Path(tree, "minisgl_core", *module.split(".")).with_suffix(".py")
        spec = importlib.util.spec_from_file_location(alias, path)
        sys.modules[alias] = importlib.util.module_from_spec(spec)  # (dataclasses look it up)
        spec.loader.exec_module(sys.modules[alias])
    return sys.modules[alias]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=128, help="requests decoding together")
    parser.add_argument("--steps", type=int, default=20, help="decode steps a timed window")
    parser.add_argument("--windows", type=int, default=10, help="timed windows a repeat (one batch)")
    parser.add_argument("--repeat", type=int, default=3, help="batches, each after the same warm-up one")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--page-size", type=int, default=16, help="KV page size (16: a GPU's default)")
    parser.add_argument("--model", help="a model directory (default: a tiny random Qwen3, built once)")
    parser.add_argument(
        "--stub-forward",
        action="store_true",
        help="skip the forward: each step's logits are a fixed random tensor (no device work but the sampling's)",
    )
    parser.add_argument("--profile", help="write cProfile stats of the timed steps to this file")
    parser.add_argument(
        "--against", help="another tree of the project, whose --swap methods alternate with ours"
    )
    parser.add_argument(
        "--swap", help="MODULE:CLASS.METHOD or MODULE:FUNCTION,... under minisgl_core (with --against)"
    )
    args = parser.parse_args()
    if bool(args.against) != bool(args.swap) or (args.against and args.windows % 2):
        parser.error("--against and --swap go together, with an even number of --windows")

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
    max_tokens = args.windows * args.steps + 8
    llm = cpu_llm(
        model,
        max_running_requests=args.batch,
        page_size=args.page_size,
        overlap=True,
        # room for every request's whole output: no retraction within the timed steps
        num_kv_tokens=max(65536, 2 * args.batch * (max_tokens + 32)),
    )
    engine = llm.engine
    methods = swaps(args.against, args.swap) if args.against else []
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
    params = SamplingParams(temperature=args.temperature, max_tokens=max_tokens, ignore_eos=True, seed=None)
    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
    totals, forwards, cpus, theirs = [], [], [], []
    for repeat in range(args.repeat + 1):  # the first is a warm-up
        rid0 = repeat * args.batch
        for i in range(args.batch):
            prompt = [1 + (i * 31 + j * 7) % 900 for j in range(8 + i % 8)]
            engine.add_request(rid0 + i, prompt, engine.admit(prompt, params))
        while engine.scheduler.waiting:  # the prefills, and the first decodes
            engine.step()
        for _ in range(2):
            engine.step()
        for window in range(args.windows):
            against = bool(methods) and (window % 2 == 0) == (window // 2 % 2 == 0)
            for cls, method, ours, other in methods:
                put(cls, method, other if against else ours)
            forward[0] = 0.0
            if profiler is not None and repeat:
                profiler.enable()
            started, cpu_started = time.perf_counter(), time.process_time()
            for _ in range(args.steps):
                engine.step()
            total, cpu = time.perf_counter() - started, time.process_time() - cpu_started
            if profiler is not None:
                profiler.disable()
            if repeat and against:
                theirs.append(cpu / args.steps * 1e6)
            elif repeat:
                totals.append(total / args.steps * 1e6)
                forwards.append(forward[0] / args.steps * 1e6)
                cpus.append(cpu / args.steps * 1e6)
        for cls, method, ours, _ in methods:
            put(cls, method, ours)
        while engine.has_work:
            engine.step()
    if engine.stats()["retractions"]:
        print("warning: requests were retracted (prefill steps among the timed ones)")

    def figures(values: list[float], digits: int = 1) -> str:
        median, low, high = statistics.median(values), min(values), max(values)
        return f"median {median:8.{digits}f}  min {low:8.{digits}f}  max {high:8.{digits}f}"

    rows = [("step", totals), ("step cpu", cpus)]
    rows += (
        []
        if args.stub_forward
        else [("forward", forwards), ("host", [t - f for t, f in zip(totals, forwards)])]
    )
    for name, values in rows:
        print(f"batch {args.batch} {name:8s} µs/step: {figures(values)}")
    if methods:
        print(f"batch {args.batch} against  µs/step: {figures(theirs)}  (cpu, {args.against}'s methods)")
        ratios = [ours / other for ours, other in zip(cpus, theirs)]
        print(f"batch {args.batch} ours/against per pair: {figures(ratios, 3)}")
    if profiler is not None:
        profiler.dump_stats(args.profile)
    llm.close()


if __name__ == "__main__":
    main()
