"""torch.distributed for tensor parallelism: joining the group, and broadcasting bytes from rank 0.

The main group uses NCCL on GPUs and gloo on CPU; the model's collectives run on it. A second,
gloo-only "control" group with a very long timeout carries the host's messages: the per-step
command broadcast, and the broadcast where ranks 1..N-1 park while the server is idle (a blocked
gloo broadcast sleeps, no busy spin unlike a pending NCCL kernel, and does not time out after
NCCL's few minutes). The per-step broadcast must not ride on NCCL: a broadcast there waits for
every kernel queued before it, so reading its result would wait for the step in flight and
undo the overlap of host and device.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import logging
import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from minisgl_core import fast_paths
from minisgl_core.api import ParallelContext

logger = logging.getLogger(__name__)

#: how long an idle rank may wait for rank 0's next step
IDLE_TIMEOUT = datetime.timedelta(days=365)
#: how long the ranks may take to meet at start-up
RENDEZVOUS_TIMEOUT = datetime.timedelta(minutes=10)
#: how long a stopping rank gives its process group's teardown (:meth:`TPGroup.close`)
LEAVE_WAIT_S = 5
#: how often each serving rank says it is alive in the rendezvous store and looks at the others
PEER_BEAT_S = 1.0
MIN_PEER_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class DistributedSpec:
    """Where the TP group meets and which ranks live on this node (picklable: sent to each rank)."""

    tp_size: int = 1
    nnodes: int = 1
    node_rank: int = 0
    #: "host:port" of rank 0's TCP rendezvous; "" on one node: the runtime holds a loopback port
    #: from start-up (:func:`loopback_listener`)
    init_addr: str = ""
    #: seconds a serving rank may go without a word in the store before its peers give it up
    #: (:class:`PeerWatch`)
    peer_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if not self.peer_timeout_s >= MIN_PEER_TIMEOUT_S:  # (also refuses nan)
            raise ValueError(
                f"--tp-peer-timeout must be at least {MIN_PEER_TIMEOUT_S:g} seconds, got {self.peer_timeout_s}"
            )
        if self.nnodes < 1:
            raise ValueError(f"--nnodes must be >= 1, got {self.nnodes}")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"--node-rank must be in [0, --nnodes={self.nnodes}), got {self.node_rank}")
        if self.tp_size % self.nnodes:
            raise ValueError(f"--tp {self.tp_size} must be a multiple of --nnodes {self.nnodes}")

    @property
    def local_ranks(self) -> range:
        per_node = self.tp_size // self.nnodes
        return range(self.node_rank * per_node, (self.node_rank + 1) * per_node)


def loopback_listener(tp_size: int) -> socket.socket:
    """A socket listening on a loopback port the kernel picked, for one-node TP's rendezvous: rank
    0's store takes it over (a port found free here and bound there could be taken in between,
    by any connection's own end)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(tp_size * 4)
    return listener


def parent_store(world: int) -> dist.TCPStore:
    """A rendezvous store hosted by a process that spawns ``world`` ranks and outlives them (the
    offline TP benchmark, the TP tests), on a loopback port the kernel picked; the ranks join it
    with :func:`join_parent_store`. Hosted by the parent, no rank's NCCL watchdog is left polling a
    store that rank 0 took down when it exited first."""
    return dist.TCPStore(
        "127.0.0.1", 0, world, is_master=True, wait_for_workers=False, timeout=RENDEZVOUS_TIMEOUT
    )


def share_cpu_threads(ranks_here: int) -> int:
    """A CPU rank's share of the node's CPUs for torch's intra-op threads, set, and returned.

    Each process's pool defaults to every core, so the ranks of one node ran ``ranks_here`` times
    as many spinning OpenMP threads as cores, each rank's waiting at barriers for cores the others
    held: a ``--tp 2`` CPU server on two cores ran 6.3x slower than with one thread a rank
    (BENCHMARKS.md, "CPU ranks share the cores"). ``OMP_NUM_THREADS``, where set, wins."""
    if ranks_here <= 1 or os.environ.get("OMP_NUM_THREADS"):
        return torch.get_num_threads()
    cores = torch.get_num_threads()  # (torch's default: the physical cores)
    if hasattr(os, "sched_getaffinity"):  # (a process pinned to fewer CPUs: those)
        cores = min(cores, len(os.sched_getaffinity(0)))
    threads = max(1, cores // ranks_here)
    torch.set_num_threads(threads)
    return threads


def join_parent_store(backend: str, rank: int, world: int, port: int) -> None:
    """Rank ``rank``: join the default process group through the :func:`parent_store` on ``port``
    (on the CPU, with its :func:`share_cpu_threads` of the node's cores)."""
    if backend == "gloo":
        share_cpu_threads(world)
    store = dist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=RENDEZVOUS_TIMEOUT)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world)


def leave_parent_store_group() -> None:
    """A rank of :func:`join_parent_store` leaving its group once its engine is closed and its
    caller dropped every reference to it. Engine start-up freezes every live object
    (``gc.freeze``), so a cycle through the engine keeps the process group alive past
    ``destroy_process_group``: gloo's worker threads then outlive the interpreter's teardown, and
    one finishing a collective late aborts the process ("terminate called without an active
    exception", exit -6) after its work was done. Collecting first lets the group go for good.

    Called in a ``finally`` while an exception is in flight (a rank failing), its traceback holds
    the frames that referenced the engine: their locals are cleared first (the traceback keeps
    its lines; the frame still running keeps its own)."""
    in_flight, seen = sys.exc_info()[1], set()
    while in_flight is not None and id(in_flight) not in seen:  # (and the exceptions it chains)
        seen.add(id(in_flight))
        traceback.clear_frames(in_flight.__traceback__)
        in_flight = in_flight.__cause__ or in_flight.__context__
    gc.unfreeze()
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()


class PeerLost(RuntimeError):
    """A broadcast on the control group failed: a peer rank's process (or its node) is gone, its
    connection closed. ``summary`` names the rank for HTTP clients; the text adds gloo's words
    (with its build paths) for the log."""

    def __init__(self, rank: int, size: int, cause: BaseException) -> None:
        if rank != 0:
            who = "rank 0"
        else:
            who = "rank 1" if size == 2 else f"one of ranks 1-{size - 1}"
        self.summary = f"lost tensor-parallel {who}"
        super().__init__(f"{self.summary}: {cause}")


class TPGroup:
    """This rank's view of the TP group: the ParallelContext handed to the engine, plus the
    byte broadcasts the scheduler uses to keep every rank on rank 0's inputs."""

    def __init__(self, parallel: ParallelContext, control_group: object | None, device: torch.device) -> None:
        self.parallel = parallel
        self.control_group = control_group
        self.device = device

    @property
    def rank(self) -> int:
        return self.parallel.tp_rank

    @property
    def size(self) -> int:
        return self.parallel.tp_size

    def broadcast_int(self, value: int = 0) -> int:
        """Rank 0's ``value`` on every rank (host to host, on the gloo control group)."""
        t = torch.tensor([value], dtype=torch.int64)
        self._broadcast(t)
        return int(t.item())

    def broadcast_bytes(self, data: bytes, length: int) -> bytes:
        """Rank 0's ``data`` (``length`` bytes, known to every rank) on every rank."""
        if self.rank == 0:
            t = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        else:
            t = torch.empty(length, dtype=torch.uint8)
        self._broadcast(t)
        return data if self.rank == 0 else t.numpy().tobytes()

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (picklable), by rank, on every rank (the control group)."""
        out: list[Any] = [None] * self.size
        with self._peers():
            dist.all_gather_object(out, obj, group=self.control_group)
        return out

    def park(self) -> None:
        """Ranks > 0: sleep until rank 0 calls :meth:`wake` (control group: no spin, no timeout)."""
        self._broadcast(torch.zeros(1))

    def wake(self) -> None:
        """Rank 0: release the ranks parked in :meth:`park`."""
        self._broadcast(torch.ones(1))

    def _broadcast(self, t: torch.Tensor) -> None:
        """Rank 0's ``t`` on every rank, on the control group; a peer gone raises :class:`PeerLost`."""
        with self._peers():
            dist.broadcast(t, src=0, group=self.control_group)

    @contextlib.contextmanager
    def _peers(self) -> Iterator[None]:
        """A collective on the control group: gloo's error for a closed connection (a
        RuntimeError; DistBackendError among them) becomes :class:`PeerLost`."""
        try:
            yield
        except RuntimeError as exc:
            raise PeerLost(self.rank, self.size, exc) from exc

    def barrier(self) -> None:
        if self.size > 1:
            dist.barrier(group=self.control_group)

    def close(self) -> None:
        """Leave the group on a clean stop, giving NCCL's teardown ``LEAVE_WAIT_S`` at most: on
        two H200s, a rank whose peer's node stopped first sat in ``destroy_process_group`` for
        ever (py-spy), with or without the rendezvous store still up. The rank has nothing left
        to do by then, and its process skips the interpreter's teardown, so a teardown still
        stuck past the bound is left behind with a warning."""
        if self.size == 1 or not dist.is_initialized():
            return
        leaving = threading.Thread(target=dist.destroy_process_group, name="minisgl-leave-group", daemon=True)
        leaving.start()
        leaving.join(LEAVE_WAIT_S)
        if leaving.is_alive():
            logger.warning(
                "tensor-parallel rank %d: leaving the process group took over %d s; stopping without it",
                self.rank,
                LEAVE_WAIT_S,
            )


def init_tp_group(
    tp_rank: int, spec: DistributedSpec, device: torch.device, listener: socket.socket | None = None
) -> TPGroup:
    """Join the TP group as ``tp_rank`` (a no-op group when tp_size is 1). Rank 0 hosts the
    rendezvous on ``listener`` where given (:func:`loopback_listener`), else binds ``spec.init_addr``."""
    if spec.tp_size == 1:
        return TPGroup(ParallelContext(), None, device)
    if device.type == "cuda":
        if device.index is None:
            device = torch.device("cuda", tp_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if backend == "gloo":
        share_cpu_threads(spec.tp_size // spec.nnodes)
    if spec.nnodes == 1:
        # One node: the ranks' own connections stay on loopback (a library left alone listens
        # on the host's outward address). A user's own setting wins.
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    store = _rendezvous_store(tp_rank, spec, listener)
    _check_group_shape(store, tp_rank, spec)
    dist.init_process_group(backend, store=store, world_size=spec.tp_size, rank=tp_rank)
    control = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)
    parallel = ParallelContext(tp_rank=tp_rank, tp_size=spec.tp_size, group=dist.group.WORLD)
    return TPGroup(parallel, control, device)


#: how often rank 0 looks whether every rank has joined, or one refused, at the rendezvous
_JOIN_POLL_S = 0.2


def _check_group_shape(store: dist.Store, tp_rank: int, spec: DistributedSpec) -> None:
    """Before the group forms, every rank checks it was started with rank 0's ``--tp`` and
    ``--nnodes``, and that no other process took its rank (two nodes with one ``--node-rank``):
    torch's own rendezvous waits out its ten minutes on either. A rank that differs says why in
    the store, and rank 0, waiting for every rank's word, stops with the same ConfigError."""
    from minisgl_core.config import ConfigError

    shape = f"--tp {spec.tp_size} --nnodes {spec.nnodes}"
    if tp_rank == 0:
        store.set("minisgl/shape", shape)
        joined = [f"minisgl/joined/{rank}" for rank in range(1, spec.tp_size)]
        deadline = time.monotonic() + RENDEZVOUS_TIMEOUT.total_seconds()
        while not store.check(joined):
            if store.check(["minisgl/refused"]):
                raise ConfigError(store.get("minisgl/refused").decode())
            if time.monotonic() > deadline:
                return  # (torch's rendezvous then says which ranks never came)
            time.sleep(_JOIN_POLL_S)
        return
    theirs = store.get("minisgl/shape").decode()  # (waits for rank 0, as the rendezvous would)
    problem = None
    if theirs != shape:
        problem = f"node {spec.node_rank} was started with {shape}, node 0 with {theirs}"
    elif store.add(f"minisgl/taken/{tp_rank}", 1) > 1:
        problem = (
            f"two nodes were started with --node-rank {spec.node_rank} (tensor-parallel rank {tp_rank} twice)"
        )
    if problem is not None:
        message = f"{problem}: start every node with the same --tp and --nnodes and its own --node-rank"
        store.set("minisgl/refused", message)
        raise ConfigError(message)
    store.set(f"minisgl/joined/{tp_rank}", "1")


def _store_addr(spec: DistributedSpec) -> tuple[str, int]:
    host, port = spec.init_addr.rsplit(":", 1)
    return host.strip("[]"), int(port)


def _rendezvous_store(tp_rank: int, spec: DistributedSpec, listener: socket.socket | None) -> dist.TCPStore:
    """The TCP store where the ranks meet. Rank 0 binds its listening socket itself (unless given
    one), to the host of ``--dist-init-addr`` only: the store's own server would listen on every
    interface."""
    host, port = _store_addr(spec)
    if tp_rank != 0:
        return dist.TCPStore(host, port, spec.tp_size, is_master=False, timeout=RENDEZVOUS_TIMEOUT)
    if listener is None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((host, port))
        except OSError as exc:
            listener.close()
            raise RuntimeError(
                f"cannot listen on --dist-init-addr {spec.init_addr} for the TP rendezvous ({exc}); "
                "give an address of this machine with a free port"
            ) from exc
        listener.listen(spec.tp_size * 4)
    return dist.TCPStore(
        host,
        port,
        spec.tp_size,
        is_master=True,
        timeout=RENDEZVOUS_TIMEOUT,
        # The store owns the socket from here on.
        master_listen_fd=listener.detach(),
    )


class PeerWatch:
    """A serving rank's word in the rendezvous store once a second, and its look at the others':
    a peer silent for ``spec.peer_timeout_s`` (its process stopped, its node gone or cut off) is
    given up, and ``on_lost`` called with the words for clients ("lost tensor-parallel rank 1").
    Without it a collective waits on a dead peer's node (NCCL until its watchdog's ten minutes;
    gloo, a frozen peer, for ever) while the step heartbeat keeps /health at 200. Rank 0 hosts
    the store: the others give rank 0 up once the store has not answered for as long.

    Two threads: one talks to the store (a client of its own; a call to a frozen store's host
    blocks for good), one judges from what the first last heard, and never blocks."""

    def __init__(self, spec: DistributedSpec, rank: int, on_lost: Callable[[str], None]) -> None:
        self.spec = spec
        self.rank = rank
        self.on_lost = on_lost
        self.peers = [peer for peer in range(spec.tp_size) if peer != rank]
        now = time.monotonic()
        #: peer -> (its count, when that count last moved); when the store last answered
        self.heard = {peer: (-1, now) for peer in self.peers}
        self.answered = now
        self._stop = threading.Event()
        for target, name in ((self._beat, "minisgl-peer-beat"), (self._judge, "minisgl-peer-judge")):
            threading.Thread(target=target, name=name, daemon=True).start()

    def _beat(self) -> None:
        host, port = _store_addr(self.spec)
        store = None
        while not self._stop.wait(PEER_BEAT_S):
            try:
                if store is None:  # (its calls' own bound: a timedelta overflows past ~1e14 s)
                    bound = min(self.spec.peer_timeout_s, RENDEZVOUS_TIMEOUT.total_seconds())
                    store = dist.TCPStore(
                        host, port, is_master=False, timeout=datetime.timedelta(seconds=bound)
                    )
                store.add(f"minisgl/beat/{self.rank}", 1)
                counts = {peer: store.add(f"minisgl/beat/{peer}", 0) for peer in self.peers}
            except RuntimeError:  # (DistStoreError) rank 0's process, the store's host, is gone,
                store = None  # or this connection broke: the next beat connects again
                continue
            now = time.monotonic()
            self.heard = {
                peer: (count, now) if count != self.heard[peer][0] else self.heard[peer]
                for peer, count in counts.items()
            }
            self.answered = now

    def _judge(self) -> None:
        timeout = self.spec.peer_timeout_s
        while not self._stop.wait(PEER_BEAT_S):
            now = time.monotonic()
            if self.rank != 0 and now - self.answered >= timeout:
                lost = f"lost tensor-parallel rank 0 (its store has not answered for {timeout:g} s)"
            else:
                # (rank 0 hosts the store: while the store is not answering, rank 0 is judged by
                # that, the line above, a beat or so later: its count's last move came before the
                # store's last answer, and a loaded machine's lagging beat gave "silent" for a
                # frozen rank 0 whose store had stopped with it)
                quiet_store = self.rank != 0 and now - self.answered >= 2 * PEER_BEAT_S
                silent = [
                    peer
                    for peer, (_, moved) in self.heard.items()
                    if now - moved >= timeout and not (peer == 0 and quiet_store)
                ]
                if not silent:
                    continue
                who = f"rank {silent[0]}" if len(silent) == 1 else f"ranks {', '.join(map(str, silent))}"
                lost = f"lost tensor-parallel {who} (silent for {timeout:g} s)"
            if not self._stop.is_set():
                self.on_lost(lost)
            return

    def stop(self) -> None:
        """No more looks (a clean stop: the peers leave at their own pace)."""
        self._stop.set()


class SymmMemAllReduce:
    """All-reduce of decode-sized tensors through PyTorch symmetric memory: buffers the peers read
    over NVLink, with barriers on the buffers' signal pads (which CUDA graphs can capture). For the
    ``[batch, hidden]`` sums of tensor-parallel decode (1-2 MB) it is latency, not bandwidth, that
    counts, and NCCL's ring pays it more than once. Bigger tensors (prefill) go to NCCL.

    Two paths, by size:

    - below :attr:`WIDE_MIN_BYTES`, PyTorch's one-shot kernel: each thread copies its elements into
      the shared buffer, waits at the barrier, then sums exactly those elements from every rank's
      buffer, so the sum can be written over the input (a thread overwrites only input it has
      already copied; peers read the shared buffer, never our input). One kernel, but its launch
      caps the blocks: on an H200 pair it moves ≈ 140 GB/s (24 µs for 2 MB, 7 µs for one row).
    - from :attr:`WIDE_MIN_BYTES` (the ``symm_mem_wide`` fast path): copy into the buffer, barrier,
      a Triton kernel over the whole tensor (a program per 8 KiB, as many as the GPU holds) that
      sums every rank's buffer in rank order into the input, and a second barrier so that no rank
      overwrites its buffer while a peer still reads it.

    ``tools/device_allreduce_check.py`` checks both against NCCL, eagerly and replayed from CUDA
    graphs with new inputs, and times them."""

    #: one-shot reads every peer's copy, so its useful size shrinks with the group
    MAX_BYTES_TIMES_WORLD = 8 << 20
    #: from this size on the wide path (when on): its four kernels cost more than the one below it
    #: (two H200s, µs in a graph: 256 KiB 10.7 vs 9.6, 512 KiB 11.7 vs 11.8, 1 MiB 13.1 vs 15.0)
    WIDE_MIN_BYTES = 768 << 10
    #: elements per program of the wide path's sum (bf16: 8 KiB)
    WIDE_BLOCK = 4096
    #: from this size on :meth:`add_rms_norm` fuses the sum with the norm after it (when on): every
    #: size, as measured (two H200s, µs per sum + add + norm in a graph, rows of 4,096 bf16, fused
    #: vs all-reduce then norm: 1 row 6.9 vs 8.2, 64 rows 8.3 vs 13.1, 256 rows 13.1 vs 18.2)
    NORM_MIN_BYTES = 0
    #: up to this many rows (when ``norm_barrier`` is on) the fused kernel passes the barrier
    #: itself: it saves the barrier kernel, but each of its programs (one per row up to two per SM)
    #: waits on its own channel, which costs more than it saves with many programs (two H200s, µs in
    #: a graph, rows of 4,096 bf16, in the kernel vs PyTorch's barrier kernel before it: 1 row 6.05
    #: vs 6.90, 64 rows 8.02 vs 8.67, 128 rows 9.84 vs 10.29, 256 rows 14.36 vs 13.62)
    NORM_BARRIER_MAX_ROWS = 128

    def __init__(
        self,
        group: Any,
        device: torch.device,
        wide: bool = False,
        norm: bool = False,
        norm_barrier: bool = True,
    ) -> None:
        import torch.distributed._symmetric_memory as symm_mem

        self.group_name = group.group_name
        self.world = dist.get_world_size(group)
        self.max_bytes = self.MAX_BYTES_TIMES_WORLD // self.world
        self.buffer = symm_mem.empty(self.max_bytes, dtype=torch.uint8, device=device)
        self.handle = symm_mem.rendezvous(self.buffer, self.group_name)
        self.wide = wide
        # every rank's buffer, for the wide path's sum
        self.buffer_ptrs = torch.tensor(list(self.handle.buffer_ptrs), dtype=torch.int64, device=device)
        self._views: dict[torch.dtype, torch.Tensor] = {}
        # the fused sum + residual add + RMS norm (add_rms_norm): two more buffers of its own, used
        # in turn, each with its own rendezvous (its own signal pads)
        self.norm_halves: list[tuple[torch.Tensor, Any, torch.Tensor, torch.Tensor]] = []
        if norm:
            for _ in range(2):
                buf = symm_mem.empty(self.max_bytes, dtype=torch.uint8, device=device)
                handle = symm_mem.rendezvous(buf, self.group_name)
                ptrs = torch.tensor(list(handle.buffer_ptrs), dtype=torch.int64, device=device)
                signals = torch.tensor(list(handle.signal_pad_ptrs), dtype=torch.int64, device=device)
                self.norm_halves.append((buf, handle, ptrs, signals))
        self._turn = 0
        # the ``symm_mem_norm_barrier`` fast path: add_rms_norm's kernel passes the barrier itself
        # (up to NORM_BARRIER_MAX_ROWS), a program per channel of the signal pads (int32 flags,
        # ``world`` per channel), at most two per SM so that every program is resident and a peer's
        # program it waits for runs
        self.norm_barrier = norm_barrier
        if norm:
            pad_bytes = getattr(self.norm_halves[0][1], "signal_pad_size", 2048)  # (PyTorch's default)
            channels = pad_bytes // (4 * self.world)
            sms = (
                torch.cuda.get_device_properties(device).multi_processor_count
                if device.type == "cuda"
                else 64
            )
            self.norm_programs = max(1, min(channels, 2 * sms))

    def __call__(self, x: torch.Tensor) -> bool:
        nbytes = x.numel() * x.element_size()
        if (
            x.dtype not in (torch.bfloat16, torch.float16, torch.float32)
            or nbytes > self.max_bytes
            or nbytes % 16
            or x.data_ptr() % 16
            or not x.is_contiguous()
            or x.device != self.buffer.device
        ):
            return False
        view = self._views.get(x.dtype)
        if view is None:
            view = self._views[x.dtype] = self.buffer.view(x.dtype)
        flat = x.view(-1)
        if self.wide and nbytes >= self.WIDE_MIN_BYTES:
            self._wide(view[: flat.numel()], flat)
        else:
            torch.ops.symm_mem.one_shot_all_reduce_copy_out(
                view[: flat.numel()], flat, "sum", self.group_name, flat
            )
        return True

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(weight * norm(sum + residual), sum + residual)`` where ``sum`` is ``x`` all-reduced:
        bitwise :meth:`__call__` then ``minisgl_core.layers.triton_ops.rms_norm`` with the
        residual, in at most three kernels (copy into a shared buffer unless the GEMM wrote there,
        barrier, one Triton kernel that sums every rank's row and adds and normalizes it; up to
        :attr:`NORM_BARRIER_MAX_ROWS` that kernel's programs pass the barrier themselves) where
        those are two (one-shot, norm) or five (the wide path's four, norm), and one pass over the
        row fewer. None when it does not apply (off, under :attr:`NORM_MIN_BYTES`, too big, not
        bf16/fp16, not contiguous): the caller all-reduces and normalizes as usual.

        No barrier after the kernel: the two buffers take turns. Before a rank writes a buffer
        again it has passed the other buffer's barrier, which every peer reaches only after its
        kernel on this buffer, i.e. after it finished reading it (with the barrier in the kernel:
        a peer's program raises its flag only once that peer's previous kernel, the one reading
        this buffer, has finished). (Every other collective in between, on the one-shot buffer or
        NCCL, only adds ordering.)"""
        from minisgl_core.layers import triton_ops

        n = x.shape[-1]
        if (
            not self._norm_fits(x.numel(), x.dtype)
            or x.dim() != 2
            or not x.is_contiguous()
            or residual.shape != x.shape
            or not residual.is_contiguous()
            or residual.dtype != x.dtype
            or x.device != self.buffer.device
            or not triton_ops.norm_enabled(x, weight)  # (the path this one must equal)
        ):
            return None
        from minisgl_core.layers._triton_collectives import sum_add_rms_norm_kernel

        buf, handle, ptrs, signals = self.norm_halves[self._turn]
        self._turn ^= 1
        shared = buf.view(x.dtype)[: x.numel()]
        if x.data_ptr() != shared.data_ptr():  # else the GEMM wrote it there (norm_input)
            shared.copy_(x.view(-1))
        rows = x.shape[0]
        barrier = self.norm_barrier and rows <= self.NORM_BARRIER_MAX_ROWS
        if barrier:
            programs = min(rows, self.norm_programs)  # the kernel's programs wait for every rank's
        else:
            programs = rows
            handle.barrier(channel=0)  # every rank's partial sum is in place
        out = torch.empty_like(x)
        total = torch.empty_like(x)
        block = triton_ops._pow2(n)
        sum_add_rms_norm_kernel[(programs,)](
            ptrs, signals, self.handle.rank, residual, weight, float(eps), out, total, rows, programs, n,
            WORLD=self.world, BLOCK=block, BARRIER=barrier, num_warps=min(16, max(1, block // 256)),
            **triton_ops.pdl_options(x.device),
        )  # fmt: skip
        return out, total

    def norm_input(self, rows: int, n: int, dtype: torch.dtype) -> torch.Tensor | None:
        """A ``[rows, n]`` view of the buffer the next :meth:`add_rms_norm` call reads this rank's
        partial sum from, for the GEMM that produces it to write there (``RowParallelLinear`` with
        ``reduce=False``), which saves the copy; None when that call would not be fused. Writing
        it is as safe as the copy it replaces: it happens at the same point of the stream."""
        if not self._norm_fits(rows * n, dtype):
            return None
        return self.norm_halves[self._turn][0].view(dtype)[: rows * n].view(rows, n)

    def _norm_fits(self, numel: int, dtype: torch.dtype) -> bool:
        """Whether :meth:`add_rms_norm` takes a sum of ``numel`` elements of ``dtype`` (its other
        conditions are on the tensors themselves)."""
        return (
            bool(self.norm_halves)
            and dtype in (torch.bfloat16, torch.float16)
            and self.NORM_MIN_BYTES <= numel * dtype.itemsize <= self.max_bytes
        )

    def _wide(self, shared: torch.Tensor, flat: torch.Tensor) -> None:
        from minisgl_core.layers._triton_collectives import sum_peer_buffers_kernel

        shared.copy_(flat)
        self.handle.barrier(channel=0)  # every rank's copy is in place
        n = flat.numel()
        sum_peer_buffers_kernel[(-(-n // self.WIDE_BLOCK),)](
            self.buffer_ptrs, flat, n, WORLD=self.world, BLOCK=self.WIDE_BLOCK, num_warps=8
        )
        self.handle.barrier(channel=0)  # every rank has read every buffer


def enable_fast_all_reduce(parallel: ParallelContext, device: torch.device) -> bool:
    """Install :class:`SymmMemAllReduce` for ``parallel``'s group (CUDA, TP > 1) unless
    the ``symm_mem`` fast path is off (:mod:`minisgl_core.fast_paths`); on any failure keep NCCL and say why. Every rank must call this at the
    same point (the buffer's rendezvous is collective)."""
    from minisgl_core.api.parallel import _fast_all_reduce

    if parallel.tp_size == 1 or device.type != "cuda" or not fast_paths.current().symm_mem:
        return False
    reducer: SymmMemAllReduce | None = None
    try:
        paths = fast_paths.current()
        reducer = SymmMemAllReduce(
            parallel.group,
            device,
            wide=paths.symm_mem_wide,
            norm=paths.symm_mem_norm,
            norm_barrier=paths.symm_mem_norm_barrier,
        )
    except Exception as exc:  # noqa: BLE001 - an optional fast path: NCCL still works
        logger.warning(
            "symmetric-memory all-reduce unavailable (%s: %s); using NCCL", type(exc).__name__, exc
        )
    # All ranks use it or none does: one rank on NCCL and another on the buffer would hang.
    ok = torch.tensor([reducer is not None], dtype=torch.int32, device=device)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=parallel.group)
    if reducer is None or not ok.item():
        return False
    _fast_all_reduce[id(parallel.group)] = reducer
    if parallel.tp_rank == 0:  # (every rank installs the same buffer: said once for the server)
        logger.info(
            "tensor parallelism: one-shot symmetric-memory all-reduce up to %d KiB, NCCL above",
            reducer.max_bytes >> 10,
        )
    return True
