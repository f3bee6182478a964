"""The pinned staging ring of host-to-device copies (``minisgl_core.runner.staging``).

On the CPU the ring runs over plain memory with stand-in streams and events, which record what
would have been waited for; on CUDA a delayed stream checks that no staged piece is overwritten
before the copy reading it has run."""

from __future__ import annotations

import pytest
import torch

from minisgl_core.runner.staging import PinnedStaging, copy_to_device, pinned_h2d_enabled


class _Event:
    def __init__(self, log: list, stream: str) -> None:
        self.log, self.stream, self.done = log, stream, False

    def synchronize(self) -> None:
        self.done = True
        self.log.append(("wait", self.stream))


class _Ring(PinnedStaging):
    """The ring with stand-ins for CUDA's streams and events."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, pin=False, **kwargs)
        self.log: list = []
        self.stream = "s0"

    def current_stream(self, device):
        return self.stream

    def record_event(self, stream):
        self.log.append(("record", stream))
        return _Event(self.log, stream)


def test_pieces_hold_the_values_aligned_and_each_segment_waits_for_its_last_copies():
    ring = _Ring(nbytes=4 * 256, segments=4)  # 256-byte segments
    outs = []
    for i in range(12):  # 40-byte int64 arrays take 64 bytes: four a segment, three segments
        host = torch.arange(5, dtype=torch.int64) + 10 * i
        ring.stream = "s1" if i == 5 else "s0"
        outs.append((host.clone(), ring.copy(host, torch.device("cpu"))))
    for expected, got in outs:
        assert torch.equal(got, expected)
    # segment 0 was left after four copies on s0; segment 1 saw s0 and s1
    assert ring.log[0] == ("record", "s0")
    assert sorted(ring.log[1:3]) == [("record", "s0"), ("record", "s1")]
    assert not any(kind == "wait" for kind, _ in ring.log)  # no segment entered twice yet
    for i in range(5):  # fill segment 3 and come back to segment 0: its copies are waited for
        ring.copy(torch.full((5,), i, dtype=torch.int64), torch.device("cpu"))
    assert ring.segment == 0 and ("wait", "s0") in ring.log
    staged = ring.stage(torch.ones(3, dtype=torch.int32))
    assert staged is not None and staged.data_ptr() % 64 == 0 and staged.dtype == torch.int32


def test_what_does_not_fit_a_segment_or_is_empty_is_copied_directly():
    ring = _Ring(nbytes=4 * 256, segments=4)
    big = torch.arange(40, dtype=torch.int64)  # 320 bytes
    assert ring.stage(big) is None and ring.stage(torch.empty(0)) is None
    assert torch.equal(ring.copy(big, torch.device("cpu")), big)
    assert ring.offset == 0 and ring.log == []


def test_it_is_off_unless_asked_and_never_off_cuda(monkeypatch):
    monkeypatch.delenv("MINISGL_PINNED_H2D", raising=False)
    assert not pinned_h2d_enabled(torch.device("cuda"))
    monkeypatch.setenv("MINISGL_PINNED_H2D", "1")
    assert pinned_h2d_enabled(torch.device("cuda"))
    assert not pinned_h2d_enabled(torch.device("cpu"))
    host = torch.tensor([3, 1, 2], dtype=torch.int32)
    assert torch.equal(copy_to_device(host, torch.device("cpu")), host)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_no_piece_is_overwritten_before_its_copy_has_run(monkeypatch):
    """The stream sleeps first, so every copy is still queued while the host fills the whole ring
    more than twice over: each piece must still be intact when its copy runs."""
    monkeypatch.setenv("MINISGL_PINNED_H2D", "1")
    ring = PinnedStaging(nbytes=8 * 1024, segments=4)  # 2 KiB segments
    device = torch.device("cuda")
    torch.cuda._sleep(200_000_000)  # ~0.1 s of the stream
    expected, outs = [], []
    for i in range(200):  # 200 pieces of 512 bytes: 50 segments' worth
        host = torch.arange(64, dtype=torch.int64) * 1000 + i
        expected.append(host.clone())
        outs.append(ring.copy(host, device))
    torch.cuda.synchronize()
    for want, got in zip(expected, outs, strict=True):
        assert torch.equal(got.cpu(), want)
    # and through the module's entry point, which the engine uses
    host = torch.arange(10, dtype=torch.int32)
    assert torch.equal(copy_to_device(host, device).cpu(), host)


def test_a_decode_step_copies_three_host_arrays_to_the_device(tmp_path, monkeypatch):
    """A plain decode step of sampled requests sends the device three host arrays: the scheduler's
    two packed ones (slots and positions; rows, lengths and chunks) and the sampler's two scale
    rows as one. Its token inputs, logits rows and the rows its sampled tokens are stored at are
    read from tensors on the device already (there were seven copies before)."""
    import minisgl_core.runner.layout as layout
    import minisgl_core.runner.sampler as sampler
    import minisgl_core.scheduler.scheduler as scheduler
    from minisgl_core import SamplingParams
    from minisgl_core.demo.factories import make_model_dir
    from minisgl_core.testing import cpu_llm

    copies: list[tuple[int, ...]] = []
    for module in (layout, sampler, scheduler):
        real = module.copy_to_device
        monkeypatch.setattr(
            module,
            "copy_to_device",
            lambda host, device, real=real: copies.append(tuple(host.shape)) or real(host, device),
        )
    model = make_model_dir(tmp_path / "qwen3", "Qwen3ForCausalLM", max_position_embeddings=256)
    llm = cpu_llm(model)
    engine = llm.engine
    params = SamplingParams(temperature=0.8, max_tokens=6, ignore_eos=True)
    per_step, kinds = [], []
    step = engine.step

    def counting_step():
        before = len(copies)
        out = step()
        batch = engine.launched_last
        kinds.append(None if batch is None else (batch.kind, len(batch.requests)))
        per_step.append(len(copies) - before)
        return out

    monkeypatch.setattr(engine, "step", counting_step)
    outputs = llm.generate([[5, 6, 7, 8], [9, 10, 11], [12, 13]], params, use_tqdm=False)
    assert all(len(o.token_ids) == 6 for o in outputs)
    decode_counts = [n for n, kind in zip(per_step, kinds) if kind == ("decode", 3)]
    assert decode_counts and max(decode_counts) == 3, (per_step, kinds)
