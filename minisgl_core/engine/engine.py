"""Engine: one TP rank's model runner, scheduler and sampler behind add_request / abort / step.

The offline :class:`~minisgl_core.llm.LLM` drives one Engine in-process; the server runs one per
scheduler process and feeds every rank the same requests in the same order.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from minisgl_core.api import ParallelContext
from minisgl_core.engine.config import EngineConfig
from minisgl_core.engine.loader import load_generation_config
from minisgl_core.engine.runner import ModelRunner
from minisgl_core.engine.sampler import SampleRequest, Sampler
from minisgl_core.plugins import Plugins
from minisgl_core.sampling import SamplingParams, StepOutput
from minisgl_core.scheduler.request import Request
from minisgl_core.scheduler.scheduler import ScheduledBatch, Scheduler
from minisgl_core.scheduler.stop import StopChecker

logger = logging.getLogger(__name__)


def eos_token_ids(hf_config: dict, generation_config: dict) -> set[int]:
    ids: set[int] = set()
    for source in (generation_config, hf_config):
        value = source.get("eos_token_id")
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list):
            ids.update(int(v) for v in value)
    return ids


class Engine:
    def __init__(
        self,
        config: EngineConfig,
        parallel: ParallelContext | None = None,
        plugins: Plugins | None = None,
        tokenizer=None,
    ) -> None:
        self.config = config
        self.parallel = parallel or ParallelContext()
        self.plugins = plugins or Plugins.load()
        torch.manual_seed(config.seed)
        self.runner = ModelRunner(config, self.parallel, self.plugins)
        self.generation_config = load_generation_config(Path(config.model))
        self.eos_ids = eos_token_ids(self.runner.hf_config, self.generation_config)
        if tokenizer is None:
            from minisgl_core.tokenizer.load import load_tokenizer

            tokenizer = load_tokenizer(config.model)
        self.tokenizer = tokenizer
        cache = self.plugins.resolve("caches", config.cache)(page_size=config.page_size)
        policy = self.plugins.resolve("policies", config.policy)()
        device = self.runner.device
        self.sampler = Sampler(self.runner.vocab_size, device)
        self.last_tokens = torch.zeros(self.runner.num_request_rows, dtype=torch.int64, device=device)
        self.scheduler = Scheduler(
            policy=policy,
            cache=cache,
            num_pages=self.runner.kv_cache.num_pages,
            page_size=config.page_size,
            # the spare row stays out of the scheduler's hands (CUDA-graph padding uses it)
            num_request_rows=self.runner.num_request_rows - 1,
            max_prefill_tokens=config.max_prefill_tokens,
            page_table=self.runner.page_table,
            last_tokens=self.last_tokens,
            prefill_attn=self.runner.prefill_attn,
            decode_attn=self.runner.decode_attn,
            stop_checker=StopChecker(self.eos_ids, lambda ids: tokenizer.decode(ids)),
            make_generator=self.sampler.make_generator,
        )

    # ------------------------------------------------------------------ properties

    @property
    def max_context_len(self) -> int:
        return self.runner.max_context_len

    @property
    def kv_capacity_tokens(self) -> int:
        return self.runner.kv_cache.num_slots

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    def stats(self) -> dict[str, int]:
        """Gauges and counters for /metrics and the benchmarks."""
        kv = self.scheduler.kv
        cache = kv.cache.size_info()
        return {
            "running": len(self.scheduler.running),
            "waiting": len(self.scheduler.waiting),
            "kv_used_tokens": kv.used_tokens(),
            "kv_total_tokens": self.kv_capacity_tokens,
            "cache_evictable_tokens": cache.evictable,
            "cache_protected_tokens": cache.protected,
            "prompt_tokens": kv.prompt_tokens,
            "cached_prompt_tokens": kv.cached_tokens,
        }

    # ------------------------------------------------------------------ requests

    def check_request(self, prompt_ids: list[int], params: SamplingParams) -> None:
        """Raise ValueError when the request can never run (checked before it is queued)."""
        if not prompt_ids:
            raise ValueError("prompt is empty")
        if any(not isinstance(t, int) or t < 0 or t >= self.runner.vocab_size for t in prompt_ids):
            raise ValueError(f"prompt token ids must be integers in [0, {self.runner.vocab_size})")
        total = len(prompt_ids) + params.max_tokens
        if total > self.max_context_len:
            raise ValueError(
                f"prompt ({len(prompt_ids)} tokens) + max_tokens ({params.max_tokens}) = {total} exceeds "
                f"the context length {self.max_context_len}; shorten the prompt or lower max_tokens"
            )
        if total > self.kv_capacity_tokens:
            raise ValueError(
                f"prompt + max_tokens = {total} tokens exceeds the KV pool ({self.kv_capacity_tokens} tokens)"
            )

    def add_request(self, rid: int, prompt_ids: list[int], params: SamplingParams) -> None:
        self.check_request(prompt_ids, params)
        self.scheduler.add(Request(rid=rid, prompt_ids=list(prompt_ids), params=params, arrival=0))

    def abort(self, rid: int) -> StepOutput | None:
        return self.scheduler.abort(rid)

    # ------------------------------------------------------------------ stepping

    def step(self) -> list[StepOutput]:
        batch = self.scheduler.schedule()
        if batch is None:
            return []
        logits = self.runner.forward(batch.forward)
        return self._finish_step(batch, logits)

    def _finish_step(self, batch: ScheduledBatch, logits: torch.Tensor) -> list[StepOutput]:
        if not batch.sampled:
            return self.scheduler.process(batch, [], [])
        reqs = [batch.requests[i] for i in batch.sampled]
        rows = logits if len(batch.sampled) == len(batch.requests) else logits[batch.sampled]
        result = self.sampler.sample(
            rows, [SampleRequest(r.params, r.output_ids, r.generator) for r in reqs]
        )
        token_ids = result.token_ids
        if self.parallel.tp_size > 1:
            # Every rank must continue with rank 0's tokens, whatever its sampler drew.
            torch.distributed.broadcast(token_ids, src=0, group=self.parallel.group)
        self.last_tokens[torch.tensor([r.row for r in reqs], device=token_ids.device)] = token_ids
        return self.scheduler.process(batch, token_ids.tolist(), result.logprobs)
