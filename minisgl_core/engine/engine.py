"""Engine: one TP rank's model runner, scheduler and sampler behind add_request / abort / step.

The offline :class:`~minisgl_core.llm.LLM` drives one Engine in-process; the server runs one per
scheduler process and feeds every rank the same requests in the same order.

With ``EngineConfig.step_trace`` set (``--step-trace FILE``, default ``$MINISGL_STEP_TRACE``),
the engine of rank 0 appends one JSON line per step to FILE: when it started and how long it
took on the host (``t``, ``dt``, seconds, monotonic clock), how many requests were added since
the step before (``new``), what it launched (``kind``: prefill, decode, mixed or verify; ``reqs``,
``tokens``, ``groups`` of cascade attention; for a mixed step ``decodes``, how many of its
requests, and tokens, are decode rows) and the queues after it (``running``, ``waiting``). With
overlap, a step's ``dt`` is about the device time of the step
before it once the device is the bottleneck. ``ms`` splits the step's host time by phase
(``schedule``, the ``forward`` and ``sample`` launches, ``sync``: waiting for the device's tokens,
``process``, and for constrained steps ``accept``, ``mask_fill``: the grammar thread's fill, and
``mask_wait``: the main thread's wait for it). It is how a run (served, offline, or one rank of a
tensor-parallel one) is read step by step; ``tools/step_trace.py`` summarises one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import IO, Any, NamedTuple, NoReturn

import torch

from minisgl_core.api import ParallelContext, ProcessContext
from minisgl_core.checkpoint.formats import source_tokenizer
from minisgl_core.checkpoint.generation_defaults import end_of_sequence, load_sampling_defaults
from minisgl_core.config import EngineConfig
from minisgl_core.engine.grammar import GrammarRunner, PendingMask
from minisgl_core.engine.plugin_failures import PluginBlame, PluginFailure, selected_plugin
from minisgl_core.engine.speculative import VerifyRunner
from minisgl_core.grammars import LazyGrammarBackend
from minisgl_core.messages import Limits
from minisgl_core.plugins import Plugins, build
from minisgl_core.request_limits import admit, check_priority
from minisgl_core.runner.model_runner import ModelRunner
from minisgl_core.runner.sampler import (
    Sampler,
    SampleRequest,
    SampleResult,
    shards_plain,
    to_device,
    vocab_ranks,
)
from minisgl_core.sampling import SamplingParams, StepOutput, TokenLogprob
from minisgl_core.scheduler.request import Request
from minisgl_core.scheduler.scheduler import ScheduledBatch, Scheduler
from minisgl_core.scheduler.speculative import Speculator, VerifyBatch, make_drafter
from minisgl_core.scheduler.stop import StopChecker
from minisgl_core.token_bans import step_bans

logger = logging.getLogger(__name__)


class Engine:
    def __init__(
        self,
        config: EngineConfig,
        parallel: ParallelContext | None = None,
        plugins: Plugins | None = None,
        tokenizer=None,
        sampling_defaults: dict[str, Any] | None = None,
        context: ProcessContext | None = None,
    ) -> None:
        """``sampling_defaults``: what a server's front end already read from
        ``--generation-config`` (its warnings said there once); None reads them here.
        ``context``: the process's, handed to a cache or policy whose constructor takes ``ctx``
        (None: a scheduler's, without options)."""
        self.config = config
        self.parallel = parallel or ParallelContext()
        self.plugins = plugins or Plugins.load()
        if context is None:
            context = ProcessContext(
                role="scheduler",
                tp_rank=self.parallel.tp_rank,
                tp_size=self.parallel.tp_size,
                _plugins=self.plugins,
            )
        torch.manual_seed(config.seed)
        # Resolve every selected plugin before the (slow) model load, so a bad choice fails fast.
        cache_cls = self.plugins.resolve("caches", config.cache)
        policy_cls = self.plugins.resolve("policies", config.policy)
        #: what requests inherit for the sampling fields they leave unset (--generation-config)
        self.sampling_defaults = (
            load_sampling_defaults(config.model, config.generation_config, self.plugins)
            if sampling_defaults is None
            else sampling_defaults
        )
        try:
            self.runner = ModelRunner(config, self.parallel, self.plugins)
        except Exception as exc:
            # the model's and the backends' first forwards run here (warm-up, graph capture): a
            # plugin raising in them is named as at a step, not a bare traceback from the runner
            self._raise_named(exc)
        # from here on the page size is the one the runner resolved (None picks by device)
        self.config = config = dataclasses.replace(config, page_size=self.runner.page_size)
        # (read for the end-of-sequence ids whatever --generation-config says)
        self.generation_config, self.eos_ids = end_of_sequence(
            self.runner.source, self.runner.hf_config, self.runner.vocab_size
        )
        if tokenizer is None:
            tokenizer = source_tokenizer(self.runner.source)
        self.tokenizer = tokenizer
        try:
            cache = build(cache_cls, context, page_size=config.page_size)
            policy = build(policy_cls, context)
        except Exception as exc:  # (a constructor that raises: named too)
            self._raise_named(exc)
        device = self.runner.device
        self.grammars = GrammarRunner(
            LazyGrammarBackend(
                self.plugins,
                config.grammar_backend,
                tokenizer,
                vocab_size=self.runner.vocab_size,
                stop_token_ids=sorted(self.eos_ids),
                fill_threads=config.grammar_threads,
            ),
            device,
            leader=self.parallel.tp_rank == 0,
        )
        self.sampler = Sampler(self.runner.vocab_size, device)
        self.sampler.warm_up(self.runner.dtype, self.runner.logit_shard_shape)
        self.last_tokens = torch.zeros(self.runner.num_request_rows, dtype=torch.int64, device=device)
        self.scheduler = Scheduler(
            policy=policy,
            cache=cache,
            num_pages=self.runner.usable_kv_pages,
            page_size=config.page_size,
            # the spare row stays out of the scheduler's hands (CUDA-graph padding uses it)
            num_request_rows=self.runner.num_request_rows - 1,
            max_prefill_tokens=config.max_prefill_tokens,
            page_table=self.runner.page_table,
            last_tokens=self.last_tokens,
            prefill_attn=self.runner.prefill_attn,
            decode_attn=self.runner.decode_attn,
            stop_checker=StopChecker(
                self.eos_ids, lambda ids, skip: tokenizer.decode(ids, skip_special_tokens=skip)
            ),
            make_generator=self.sampler.make_generator,
            cascade=self.runner.cascade,
            mixed=self.runner.mixed,
            policy_label=selected_plugin(self.plugins, "policies", config.policy),
            leader=self.parallel.tp_rank == 0,
        )
        self.scheduler.cascade_mixed = self.runner.split_mixed is not None
        #: names the selected plugin an exception of a step came from (see step)
        self.blame = PluginBlame(
            self.plugins,
            _selections(
                config, [(self.runner.hf_config.get("architectures") or ["?"])[0]], self.runner.attn_names
            ),
        )
        #: the plugin failure that stopped this engine (None: none)
        self.failure: PluginFailure | None = None
        # On the CPU the forward is synchronous, so overlap gains nothing there, but it runs the
        # same lagged bookkeeping, which keeps that logic under test in CI.
        self.overlap = config.overlap
        #: speculative decoding (None: off); its steps need the newest tokens on the host, so no overlap
        self.verify: VerifyRunner | None = None
        if config.speculative_algorithm is not None:
            self.overlap = False
            drafter = make_drafter(
                config.speculative_algorithm,
                ngram_max=config.speculative_ngram_max,
                ngram_min=config.speculative_ngram_min,
            )
            speculator = Speculator(drafter, config.speculative_num_draft_tokens)
            self.scheduler.speculate = speculator.build
            self.verify = VerifyRunner(
                speculator,
                runner=self.runner,
                sampler=self.sampler,
                grammars=self.grammars,
                scheduler=self.scheduler,
                last_tokens=self.last_tokens,
                parallel=self.parallel,
                timer=self._time,
            )
        self._inflight: _InFlight | None = None
        #: called with each step's batch (None: nothing) once it is planned, before it runs: rank
        #: 0's loop then takes the stats its step heartbeat reports, which count the prompts the
        #: step prefills as running, no longer waiting (/get_load)
        self.on_planned: Callable[[ScheduledBatch | None], None] | None = None
        #: /pause_generation: the engine landed its step in flight and plans none until the next
        #: :meth:`step` (:meth:`land`)
        self.paused = False
        self._early_outputs: list[StepOutput] = []
        #: the requests the last step sampled, in order, when none has constraints of its own, and
        #: what the sampler read of them (:meth:`_sample_requests`)
        self._last_samples: tuple[list[Request] | None, tuple[SampleRequest, ...]] = (None, ())
        #: the batch the last step() launched (None: nothing), for step traces and diagnostics
        self.launched_last: ScheduledBatch | None = None
        #: the step trace (rank 0, config.step_trace), line-buffered; requests added since the last step
        self.trace: IO[str] | None = _open_step_trace(
            config.step_trace if self.parallel.tp_rank == 0 else None
        )
        self._added_since_step = 0
        #: host seconds per phase of the step being traced (None: no trace), see _trace_step
        self._phases: dict[str, float] | None = {} if self.trace is not None else None
        if self.trace is not None:  # and the parts of planning a step (schedule.plan, ...)
            self.scheduler.timer = self._time
        _freeze_startup_objects()

    def _raise_named(self, exc: Exception) -> NoReturn:
        """Raise ``exc`` of the engine's start as a :class:`PluginFailure` naming the selected
        plugin it came from; as it is when it is the core's own."""
        failure = PluginBlame(self.plugins, _selected_at_start(self.config, self.plugins)).failure(exc)
        if failure is None:
            raise exc
        raise failure from exc

    # ------------------------------------------------------------------ properties

    @property
    def max_context_len(self) -> int:
        return self.runner.max_context_len

    @property
    def kv_capacity_tokens(self) -> int:
        return self.runner.usable_kv_pages * self.config.page_size

    @property
    def uses_priority(self) -> bool:
        """The scheduling policy orders requests by priority (``SchedulingPolicy.uses_priority``):
        only then may a request have a non-zero one."""
        return bool(getattr(self.scheduler.policy, "uses_priority", False))

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work or self._inflight is not None

    def stats(self) -> dict[str, int]:
        """Gauges and counters for /metrics and the benchmarks."""
        kv = self.scheduler.kv
        cache = kv.size_info()
        spec = self.verify.speculator.stats.as_dict() if self.verify is not None else {}
        # A prompt part-way through its chunks stays in the scheduler's queue between its steps,
        # but every step computes its next chunk (and it holds KV): it runs. Waiting is what no
        # step has taken yet, SGLang's waiting_queue (which its chunked request leaves too).
        started = sum(1 for r in self.scheduler.waiting.values() if r.admitted)
        return spec | {
            "running": len(self.scheduler.running) + started,
            # a request waiting for its grammar's compile waits as much as one in the queue
            "waiting": len(self.scheduler.waiting) - started + self.grammars.compiling,
            "kv_used_tokens": kv.used_tokens(),
            "kv_total_tokens": self.kv_capacity_tokens,
            "cache_evictable_tokens": cache.evictable,
            "cache_protected_tokens": cache.protected,
            "prompt_tokens": kv.prompt_tokens,
            "cached_prompt_tokens": kv.cached_tokens,
            "retractions": kv.retractions,
        }

    # ------------------------------------------------------------------ requests

    @property
    def limits(self) -> Limits:
        """What every request must fit in (the server's tokenizer gets them in the ready handshake)."""
        return Limits(
            self.max_context_len, self.kv_capacity_tokens, self.runner.vocab_size, sorted(self.eos_ids)
        )

    def admit(self, prompt_ids: list[int], params: SamplingParams) -> SamplingParams:
        """The offline path's admission: ``params`` with ``max_tokens`` decided (None = what the
        context leaves, at most the model's default); ValueError when the request can never run,
        a GrammarError (a ValueError) naming what is wrong with its grammar. The server's
        tokenizer worker does the same with the limits of the ready handshake."""
        params = admit(
            prompt_ids,
            params,
            self.limits,
            self.sampling_defaults.get("max_tokens"),
            encode=lambda text: self.tokenizer.encode(text, add_special_tokens=False),
        )
        if params.grammar is not None:
            self.grammars.backend.check(params.grammar)
        return params

    def add_request(
        self,
        rid: int,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        compile_aside: bool = False,
        priority: int = 0,
        cache_salt: int = 0,
        prediction_ids: list[int] | None = None,
    ) -> None:
        """Queue an admitted request (:meth:`admit`, or the server's tokenizer): it is not checked
        again. A GrammarError (a ValueError) when its grammar does not compile. ``priority``: the
        client's (lower runs earlier), checked where the request entered (:func:`check_priority`).
        ``cache_salt``: its vLLM cache salt's key (``request_limits.cache_salt_key``; 0: none): it
        shares prefix-cache entries only with requests of the same salt. ``prediction_ids``:
        OpenAI's predicted output, tokenized: the speculative drafter proposes from it (it changes
        the speed, never the output; without speculative decoding nothing reads it).

        ``compile_aside`` (the server): a grammar not compiled before compiles on another thread
        and the request waits beside the queues until :meth:`admit_compiled` is told its compile
        ended; no GrammarError here then. Otherwise (the offline path) it compiles now."""
        if params.max_tokens is None:
            raise ValueError("admit the request first: its max_tokens is not decided")
        if params.bad_words and params.bad_words_token_ids is None:
            raise ValueError("admit the request first: its bad_words are not tokenized")
        if params.n != 1:  # (its other choices would be dropped without a word)
            raise ValueError(
                f"n={params.n}: an engine runs one completion a request; add one request per choice "
                "(SamplingParams.for_choice), as LLM.generate does"
            )
        if priority:  # (0, nearly every request's, needs no look)
            check_priority(priority, self.uses_priority, self.config.policy, "keyword")
        self._check_not_failed()
        req = Request(
            rid=rid,
            prompt_ids=list(prompt_ids),
            params=params,
            arrival=0,
            priority=priority,
            cache_salt=cache_salt,
            prediction_ids=prediction_ids or None,
        )
        if compile_aside and self.grammars.needs_compile(req):
            self.grammars.start_compile(req)
            return
        self.grammars.attach(req)  # compiled once per distinct grammar (the backend caches)
        self.scheduler.add(req)
        self._added_since_step += 1

    @property
    def compiling(self) -> int:
        """Requests waiting for their grammar's compile (``add_request(..., compile_aside=True)``)."""
        return self.grammars.compiling

    def compiles_settled(self) -> tuple[list[int], list[int]]:
        """(requests whose grammar compile has ended; requests that have waited for theirs longer
        than ``EngineConfig.grammar_compile_timeout``), by rid: what rank 0 tells every rank to
        :meth:`admit_compiled`."""
        return self.grammars.settled(self.config.grammar_compile_timeout)

    def admit_compiled(self, done: list[int], overdue: list[int]) -> list[StepOutput]:
        """Queue the requests of ``done`` (waiting, on another rank, for its own compile to end)
        and drop those of ``overdue``; the outputs of the requests that end here: finish reason
        "invalid" (their grammar did not compile, or not in time)."""
        ended: list[StepOutput] = []
        for rid in done:
            try:
                req = self.grammars.finish_compile(rid)
            except ValueError as exc:
                ended.append(StepOutput(rid, -1, True, "invalid", error=str(exc), error_param="grammar"))
                continue
            if req is not None:  # else aborted meanwhile
                self.scheduler.add(req)
                self._added_since_step += 1
        overran = (  # overdue is empty without a timeout
            f"the grammar did not compile within {self.config.grammar_compile_timeout or 0:g} s "
            "(--grammar-compile-timeout): simplify it (a JSON schema with thousands of optional "
            "properties, for one)"
        )
        for rid in overdue:
            if self.grammars.drop_compile(rid):
                ended.append(StepOutput(rid, -1, True, "invalid", error=overran, error_param="grammar"))
        return ended

    def flush_cache(self) -> int | None:
        """Empty the prefix cache (SGLang's ``/flush_cache``, vLLM's ``reset_prefix_cache``): the
        number of cached tokens freed; None, and nothing done, while requests are running, waiting
        or compiling their grammar (their prefixes are in use: the cache would not be empty). While
        generation is paused (:meth:`land`) requests that hold no KV may wait: those retracted."""
        if self._inflight is not None or self.scheduler.holds_kv:
            return None
        if not self.paused and (self.scheduler.has_work or self.grammars.compiling):
            return None
        return self.scheduler.kv.flush()

    def land(self) -> list[StepOutput]:
        """Land the step in flight (overlap) and plan none (SGLang's ``/pause_generation``): what
        it produced. The engine then steps again only when told to (:meth:`step`); meanwhile
        :attr:`paused` is True."""
        self._check_not_failed()
        self.paused = True
        outputs, self._early_outputs = self._early_outputs, []
        if self._inflight is not None:
            try:
                outputs += self._complete(self._inflight)
            except Exception as exc:
                self._blame(exc)
                raise
            finally:
                self._inflight = None
        return outputs

    def retract_all(self) -> int:
        """After :meth:`land`: every request gives its KV back (to the prefix cache) and waits to
        be computed again (``/pause_generation`` mode ``retract``); how many did."""
        assert self._inflight is None
        return self.scheduler.retract_all()

    @property
    def quiet(self) -> bool:
        """No step in flight, and none planned until told: :attr:`idle`, or paused after
        :meth:`land` (the running requests then keep what they computed)."""
        return self.idle or (self.paused and self._inflight is None)

    @property
    def idle(self) -> bool:
        """No request runs, waits or compiles its grammar."""
        return not self.has_work and not self.grammars.compiling

    def stage_weights(self, path: str) -> torch.nn.Module:
        """SGLang's ``update_weights_from_disk``, first half: the model at ``path`` loaded beside
        the served one, which serves on unchanged (ModelRunner.stage_weights; a ValueError or
        FileNotFoundError saying why it cannot be)."""
        self._check_not_failed()
        return self.runner.stage_weights(path, self.plugins)

    def adopt_weights(self, staged: torch.nn.Module, flush_cache: bool = True) -> int:
        """The second half, while :attr:`idle`: the served model takes the staged weights in
        place, and with ``flush_cache`` the prefix cache (the old weights' keys and values) is
        emptied; the cached tokens freed. The staged copy's memory goes back to the device."""
        if not self.quiet:
            raise RuntimeError("weights are adopted only while no request runs or waits, or paused")
        if flush_cache and self.scheduler.holds_kv:
            raise RuntimeError("the prefix cache cannot be emptied while requests hold KV")
        self.runner.adopt_weights(staged)
        freed = self.scheduler.kv.flush() if flush_cache else 0
        return freed

    def update_weights(self, path: str, flush_cache: bool = True) -> int:
        """Both halves at once (one process: the offline ``LLM``), while :attr:`idle`."""
        if not self.idle:
            raise RuntimeError("weights are updated only while no request runs or waits")
        staged = None
        try:
            staged = self.stage_weights(path)
            return self.adopt_weights(staged, flush_cache)
        finally:
            staged = None
            self.release_staged()

    def release_staged(self) -> None:
        """Give a staged model's memory back once nothing holds it (its layers' weight loaders
        are bound methods: cycles, which only the collector frees)."""
        gc.collect()
        if self.runner.device.type == "cuda":
            torch.cuda.empty_cache()

    def abort(self, rid: int) -> StepOutput | None:
        self._check_not_failed()  # (releasing a half-stepped request's KV would corrupt the cache)
        if self.grammars.drop_compile(rid):
            return StepOutput(rid, -1, True, "abort")
        return self.scheduler.abort(rid)

    def close(self) -> None:
        """Drop the model, the KV pool and the scheduler now rather than whenever the garbage
        collector runs."""
        self._inflight = self.launched_last = self.verify = None
        self._early_outputs = []
        self._last_samples = (None, ())
        gc.unfreeze()  # what this engine built may be collected again (see _freeze_startup_objects)
        self.grammars.close()
        if self.trace is not None:
            self.trace.close()
            self.trace = None
        runner = self.runner
        device = runner.device
        # More cycles hold the big tensors: the weights' loaders are bound methods of their layers,
        # and CUDA graphs point back at the runner. So empty the tensors themselves: the memory
        # goes now, whoever still holds a layer or a view of the pool.
        runner.graphs = None
        for tensor in [*runner.model.parameters(), *runner.model.buffers()]:
            tensor.data = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
        runner.kv_cache.buffer.untyped_storage().resize_(0)
        del self.scheduler, self.runner, self.sampler, self.last_tokens, runner
        if device.type == "cuda":
            torch.cuda.empty_cache()

    # ------------------------------------------------------------------ stepping

    def step(self) -> list[StepOutput]:
        """Run one step (ending a pause: :meth:`land`); returns what finished steps produced.

        With overlap the step planned here is launched before the previous step's
        tokens are read back, so the host plans step N+1 while the device runs step N; outputs
        then lag one step behind the launch. A batch whose sampling reads the newest output
        tokens on the host (penalties) waits for the previous step first.

        An exception from a selected plugin's code (the model, an attention backend, the cache)
        is raised as a :class:`PluginFailure` naming it, chained to the plugin's own, and the
        engine steps no more: the step was planned (its prompts offered to the prefix cache, its
        requests advanced) but never computed. (A policy's exception costs only its plan.)
        """
        self._check_not_failed()
        self.paused = False
        try:
            if self.trace is None:
                return self._step()
            started = time.monotonic()
            outputs = self._step()
            self._trace_step(started, time.monotonic())
            return outputs
        except Exception as exc:
            self._blame(exc)
            raise

    def _blame(self, exc: Exception) -> None:
        """A selected plugin's exception is raised as a :class:`PluginFailure` naming it (the
        engine steps no more); anything else returns, for the caller to re-raise."""
        failure = self.blame.failure(exc)
        if failure is not None:
            self.failure = failure
            raise failure from exc

    def _check_not_failed(self) -> None:
        if self.failure is not None:
            message = f"the engine stopped after a step failed: {self.failure}"
            raise PluginFailure(message, self.failure.summary) from self.failure

    def _trace_step(self, started: float, now: float) -> None:
        assert self.trace is not None
        record: dict[str, Any] = {
            "t": round(started, 6),
            "dt": round(now - started, 6),
            "new": self._added_since_step,
        }
        self._added_since_step = 0
        batch = self.launched_last
        if batch is not None:
            record |= {
                "kind": "verify" if isinstance(batch, VerifyBatch) else batch.kind,
                "reqs": len(batch.requests),
                "tokens": sum(batch.chunk_lens),
                "groups": len(batch.forward.shared_prefixes or ()),
            }
            if batch.decodes:  # a mixed step: its decode rows (one token each) among the tokens
                record["decodes"] = batch.decodes
        record |= {"running": len(self.scheduler.running), "waiting": len(self.scheduler.waiting)}
        if self._phases:
            record["ms"] = {k: round(v * 1e3, 3) for k, v in self._phases.items()}
            self._phases.clear()
        try:
            self.trace.write(json.dumps(record) + "\n")
        except OSError as exc:  # (a full disk: the step's outputs were lost, the server went down)
            self._stop_trace(exc)

    def _stop_trace(self, exc: OSError) -> None:
        """The trace is a diagnostic: one it cannot write ends, said once; the engine goes on."""
        assert self.trace is not None
        logger.warning(
            "the step trace %s (--step-trace) cannot be written to: %s; no more steps are traced",
            self.trace.name, exc.strerror or exc,
        )  # fmt: skip
        with contextlib.suppress(OSError):  # (the line it could not write is still buffered)
            self.trace.close()
        self.trace = self._phases = self.scheduler.timer = None

    def _step(self) -> list[StepOutput]:
        if self._inflight is not None and self._planning_needs_host_outputs():
            # Land the step in flight before planning: a request it finishes (a stop string, EOS)
            # must not be planned again, since its row and KV are released when it finishes and
            # this batch's sampling would read them; and a request retracted keeps every token.
            self._complete_inflight_now()
        started = time.perf_counter()
        batch = self.scheduler.schedule()
        self._time("schedule", started)
        if self.on_planned is not None:
            self.on_planned(batch)
        self.launched_last = batch
        outputs, self._early_outputs = self._early_outputs, []
        if self._inflight is not None and (batch is None or not self.overlap):
            outputs += self._complete(self._inflight)
            self._inflight = None
        if batch is None:
            return outputs
        if isinstance(batch, VerifyBatch):  # speculative: never overlapped, nothing in flight
            assert self.verify is not None and self._inflight is None
            return outputs + self.verify.run(batch)
        launched = self._launch(batch)
        if self.overlap:
            if self._inflight is not None:
                outputs += self._complete(self._inflight)
            if launched.grammar_mask is None:  # else sampled once its bitmask is filled (_launch)
                self._sample(launched)
            self._inflight = launched
        else:
            outputs += self._complete(launched)
        return outputs

    def _planning_needs_host_outputs(self) -> bool:
        """Whether the next step may plan a request whose sampling needs the step in flight first,
        or may retract one: without overlap always; with it when a request that could be planned
        uses penalties, or when decode may run out of pages."""
        if not self.overlap:
            return True
        return self.scheduler.host_output_requests > 0 or self.scheduler.decode_may_retract()

    def _complete_inflight_now(self) -> None:
        """Land the step in flight before planning the next; its outputs go out with this step's."""
        if self._inflight is not None:
            self._early_outputs += self._complete(self._inflight)
            self._inflight = None

    def _launch(self, batch: ScheduledBatch) -> _InFlight:
        started = time.perf_counter()
        run = self.runner.prepare(batch.forward)
        self._time("forward", started)
        inflight = self._inflight
        if inflight is not None and inflight.logits is not None:
            # The step in flight is constrained and its sampling waited for its bitmask, which the
            # grammar thread filled while this step was planned and prepared: launch that sampling
            # now, before this forward reads its tokens, and gather this step's decode inputs
            # again (they were gathered when planned, before the sampling that writes them).
            self._sample(inflight)
            rows = batch.decode_rows
            if rows is not None:
                batch.forward.input_ids[: rows.numel()] = self.last_tokens[rows]
        started = time.perf_counter()
        logits = run()
        self._time("forward", started)
        prompt = self._prompt_logprobs(batch, logits) if batch.prompt_rows else None
        if not batch.sampled:
            return _InFlight(batch, None, None, None, prompt=prompt)
        reqs = batch.sampled_requests()
        # what sampling needs, taken now: landing the step in flight may release a row
        samples = self._sample_requests(reqs, logits.device)
        launched = _InFlight(
            batch, None, None, None, logits=logits, sampling=([r.row for r in reqs], samples), prompt=prompt
        )
        if self.scheduler.grammar_requests and any(r.matcher is not None for r in reqs):
            # The device runs the forward just launched while the host brings the matchers up to
            # date (with overlap, the step before this one may still be in flight: its tokens
            # come first) and fills this step's bitmask. With a step in flight, the fill runs on
            # the grammar thread while this one lands that step (_step), and the sampling waits.
            background = self._inflight is not None and self.overlap
            if self._inflight is not None:
                self._advance_grammars(self._inflight)
            launched.grammar_mask = self.grammars.bitmask(reqs, background=background)
            if background:
                return launched  # sampled by the next _launch, or when it lands
        self._sample(launched)
        return launched

    def _sample_requests(self, reqs: list[Request], device: torch.device) -> tuple[SampleRequest, ...]:
        """What the sampler reads of each of ``reqs``. The last step's list when it sampled the
        same requests in the same order and none has constraints of its own: each such request's
        SampleRequest is the one it keeps for its life (:meth:`Request.sample_request`), and a
        decode-bound run samples the same hundreds of requests step after step (the list made
        again was 4% of the host's step at 256 requests on the dev CPU). A request with
        constraints of its own gets a new one a step: its bans follow its output."""
        last_reqs, last_samples = self._last_samples
        if reqs == last_reqs:  # (Request compares by identity: a C loop over the two lists)
            return last_samples
        eos = self.scheduler.stop_checker.eos_ids
        samples = tuple([
            SampleRequest(
                r.params, r.output_ids, r.generator, r.prompt_ids,
                step_bans(r.params, r.output_ids, eos), r.allowed_ids_on(device),
            )
            if r.has_own_constraints
            else r.sample_request()
            for r in reqs
        ])  # fmt: skip
        constrained = any(r.has_own_constraints for r in reqs)
        self._last_samples = (None if constrained else list(reqs), samples)
        return samples

    def _sample(self, launched: _InFlight) -> None:
        """Launch the sampling of a launched forward, once (with its grammar bitmask, if any)."""
        logits, launched.logits = launched.logits, None
        if logits is None:
            return
        batch = launched.batch
        assert launched.sampling is not None
        request_rows, samples = launched.sampling
        pending, launched.grammar_mask = launched.grammar_mask, None
        grammar_mask = None
        if pending is not None:
            started = time.perf_counter()
            grammar_mask = pending.result()
            self._time("mask_wait", started)
            if pending.fill_seconds is not None:
                self._time("mask_fill", 0.0, pending.fill_seconds)
        if batch.logit_rows is not None:
            rows = logits[to_device([batch.logit_rows[i] for i in batch.sampled], logits.device)]
        elif len(batch.sampled) == len(batch.requests):
            rows = logits
        else:
            rows = logits[to_device(batch.sampled, logits.device)]
        started = time.perf_counter()
        shard = self.runner.logit_shard
        if shard is not None and grammar_mask is None and shards_plain(samples):
            # each rank draws over its slice of the vocabulary; the ranks agree on the tokens
            result = self.sampler.sample_sharded(rows, samples, shard, self.parallel)
            token_ids = result.token_ids
        else:
            result = self.sampler.sample(self.runner.full_logits(rows), samples, grammar_mask)
            token_ids = result.token_ids
            if self.parallel.tp_size > 1:
                # Every rank continues with rank 0's tokens, whatever its own sampler drew.
                torch.distributed.broadcast(token_ids, src=0, group=self.parallel.group)
        if (
            batch.kind == "decode"
            and batch.decode_rows is not None
            and len(request_rows) == batch.decode_rows.numel()
        ):
            rows_dev = batch.decode_rows  # every request sampled: the batch's rows, on the device already
        else:
            rows_dev = to_device(request_rows, token_ids.device)
        self.last_tokens[rows_dev] = token_ids
        done = None
        if token_ids.is_cuda:
            # Pinned memory: a copy into pageable memory would block until the step finishes.
            host = torch.empty(token_ids.shape, dtype=token_ids.dtype, pin_memory=True)
            host.copy_(token_ids, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
        else:
            host = token_ids
        launched.result, launched.host_tokens, launched.done = result, host, done
        self._time("sample", started)

    def _prompt_logprobs(self, batch: ScheduledBatch, logits: torch.Tensor) -> PromptLogprobs:
        """Launch the logprobs of the prompt tokens this step scores (``batch.prompt_rows``): for
        each row the next prompt token's logprob and vocabulary rank, and the top k (the most any
        of its requests asks for), float32 over the whole vocabulary, as the sampler's logprobs."""
        rows: list[int] = []
        targets: list[int] = []
        k = 0
        for i, first, count, position in batch.prompt_rows:
            req = batch.requests[i]
            rows.extend(range(first, first + count))
            targets.extend(req.prompt_ids[position + 1 : position + 1 + count])
            k = max(k, req.params.prompt_logprobs or 0)
        full = self.runner.full_logits(logits[to_device(rows, logits.device)])
        logprobs = torch.log_softmax(full.float(), dim=-1)
        chosen = logprobs.gather(1, to_device(targets, logprobs.device)[:, None])
        ranks = vocab_ranks(logprobs, chosen)
        top = logprobs.topk(k, dim=-1) if k else None
        return PromptLogprobs(chosen.squeeze(1), ranks, *(top or (None, None)))

    def _land_prompt_logprobs(self, inflight: _InFlight) -> None:
        """Append a landed step's prompt logprobs to its requests (before their outputs are made)."""
        if inflight.prompt is None:
            return
        chosen, ranks, top_values, top_ids = (t.tolist() if t is not None else None for t in inflight.prompt)
        inflight.prompt = None
        row = 0
        for i, _, count, position in inflight.batch.prompt_rows:
            req = inflight.batch.requests[i]
            k = req.params.prompt_logprobs or 0
            assert req.prompt_logprobs is not None and len(req.prompt_logprobs) == position + 1
            for j in range(row, row + count):
                top = (
                    list(zip(top_ids[j][:k], top_values[j][:k]))
                    if k and top_ids is not None and top_values is not None
                    else []
                )
                token_id = req.prompt_ids[len(req.prompt_logprobs)]
                req.prompt_logprobs.append(TokenLogprob(token_id, chosen[j], top, ranks[j]))
            row += count

    def _complete(self, inflight: _InFlight) -> list[StepOutput]:
        self._sample(inflight)
        self._land_prompt_logprobs(inflight)
        if inflight.result is None:
            return self.scheduler.process(inflight.batch, [], [])
        self._advance_grammars(inflight)
        token_ids = self._tokens_of(inflight)
        started = time.perf_counter()
        outputs = self.scheduler.process(inflight.batch, token_ids, inflight.result.logprobs(token_ids))
        self._time("process", started)
        return outputs

    def _tokens_of(self, inflight: _InFlight) -> list[int]:
        """A step's sampled tokens on the host (the wait for the device is timed: ``sync``)."""
        started = time.perf_counter()
        tokens = inflight.token_list()
        self._time("sync", started)
        return tokens

    def _time(self, phase: str, started: float, seconds: float | None = None) -> None:
        """Add to the step trace's host time of ``phase`` (only while a trace is written)."""
        if self._phases is not None:
            spent = seconds if seconds is not None else time.perf_counter() - started
            self._phases[phase] = self._phases.get(phase, 0.0) + spent

    def _advance_grammars(self, inflight: _InFlight) -> None:
        """Feed a step's sampled tokens to the matchers of its constrained requests, once."""
        if inflight.result is None or inflight.grammars_advanced:
            return
        inflight.grammars_advanced = True
        batch = inflight.batch
        reqs = batch.sampled_requests()
        # (no request waiting or running has a grammar: none of these has a live matcher)
        if self.scheduler.grammar_requests and any(r.matcher is not None for r in reqs):
            tokens = self._tokens_of(inflight)
            started = time.perf_counter()
            self.grammars.accept(reqs, tokens, self.scheduler.running)
            self._time("accept", started)


class PromptLogprobs(NamedTuple):
    """One step's prompt logprobs on the device, a row per scored prompt token."""

    chosen: torch.Tensor
    ranks: torch.Tensor
    #: the top k per row (k the most the step's requests ask for), None when k is 0
    top_values: torch.Tensor | None
    top_ids: torch.Tensor | None


@dataclass(eq=False)
class _InFlight:
    batch: ScheduledBatch
    result: SampleResult | None
    host_tokens: torch.Tensor | None
    done: torch.cuda.Event | None
    #: whether the constrained requests' matchers have taken this step's tokens
    grammars_advanced: bool = False
    #: the forward's logits until its sampling is launched (Engine._sample), and its bitmask
    logits: torch.Tensor | None = None
    grammar_mask: PendingMask | None = None
    #: the sampled requests' rows and what their sampling reads, taken at launch
    sampling: tuple[list[int], tuple[SampleRequest, ...]] | None = None
    #: the step's prompt logprobs on the device (Engine._prompt_logprobs), until it lands
    prompt: PromptLogprobs | None = None
    _tokens: list[int] | None = None

    def token_list(self) -> list[int]:
        """The sampled tokens on the host, waiting for the device to produce them if need be."""
        if self._tokens is None:
            assert self.host_tokens is not None
            if self.done is not None:
                self.done.synchronize()
            self._tokens = self.host_tokens.tolist()
        return self._tokens


def _freeze_startup_objects() -> None:
    """Keep the garbage collector's full passes off the engine's steps: move every object alive now
    (torch, the model, the tokenizer: ~380k objects after a CPU start-up) to the permanent
    generation, which collections never scan. Without it a full collection, due every few
    seconds of steps that allocate (constrained decoding does more), stalled one step for 166 ms on
    the dev CPU and 347 ms on the GPU machine's host (a step trace's ``process`` phase)."""
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    logger.debug(
        "gc: %d objects frozen in %.0f ms", gc.get_freeze_count(), (time.perf_counter() - started) * 1e3
    )


def _selected_at_start(config: EngineConfig, plugins: Plugins) -> list[tuple[str, str]]:
    """The selections a failed start may blame, before the runner has resolved them: the model's
    architecture (every registered one where the model does not open), the attention backends
    named (every registered one under ``auto``), the cache, policy and quantization method."""
    from minisgl_core.checkpoint.formats import open_model
    from minisgl_core.config import attention_names

    try:
        models = list(open_model(config.model, plugins).hf_config().get("architectures") or [])
    except Exception:  # noqa: BLE001 - the start's own error says what is wrong with the model
        models = plugins.names("models")
    attention = attention_names(config.attn) or tuple(plugins.names("attention"))
    return _selections(config, models, attention)


def _selections(
    config: EngineConfig, models: Iterable[str], attention: Iterable[str]
) -> list[tuple[str, str]]:
    """What the engine runs of each plugin kind, for :class:`PluginBlame`: the given models and
    attention backends, and the config's cache, policy and quantization method."""
    return [
        *(("models", name) for name in models),
        *(("attention", name) for name in attention),
        ("caches", config.cache),
        ("policies", config.policy),
        *((("quantization", config.quantization),) if config.quantization else ()),
    ]


def _open_step_trace(path: str | None) -> IO[str] | None:
    # line-buffered, open as long as the engine: a trace read while the run goes on is whole
    return open(path, "a", buffering=1) if path else None  # noqa: SIM115
