"""Engine backend that calls a Triton role model (``draft`` / ``target`` / ``judge``) over BLS.

Used inside the ``lookahead_reasoning`` Triton model (``async def execute``): each engine call becomes one
``pb_utils.InferenceRequest`` to the role model (the role models are decoupled so that concurrent calls
interleave and join the engine's in-flight batch). The call is the synchronous ``exec(decoupled=True)`` plus
the iteration of its response iterator, run in a worker thread (the given executor, else the event loop's
default one) and awaited; the executor's size caps the BLS calls in flight.
Not ``async_exec``: in the python_backend this project's Triton bundles, its executor callback holds a
dangling reference to the stub (a use-after-free fixed upstream in triton-inference-server/python_backend
PR #439, June 2026), the likely cause of the glibc heap corruption the orchestrator's stub showed here under
concurrent load with ``async_exec``; and iterating a decoupled response iterator on the event loop thread
would block the loop. Each call's response iterator and responses are kept alive for a while after the call
(:class:`DeferredRelease` says why). Tensor layout: :mod:`.role_tensors`. :class:`TritonBLSEngine` works only
inside a Triton Python-backend process.
"""

from __future__ import annotations

import asyncio
import collections
import math
import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

from .base import GenerationRequest, GenerationResult, check_stop_fields
from .role_tensors import ROLE_OUTPUTS, arrays_to_results, internal_parameters, requests_to_arrays
from .tokenizer import TokenizerAccess

#: The role model's outputs a BLS call requests: all of them (:data:`.role_tensors.ROLE_OUTPUTS`).
OUTPUTS = [t.name for t in ROLE_OUTPUTS]


class DeferredRelease:
    """Keeps objects alive for at least ``delay_s`` seconds, then drops them in a Python thread that holds the GIL
    (the next :meth:`hold` or :meth:`sweep` call; :meth:`release_all` at the model's ``finalize``). Thread-safe.

    Why the BLS calls need it (python_backend r24.x: ``src/pb_stub.cc`` ``Stub::SendCleanupId``,
    ``src/pb_response_iterator.cc``, ``src/pb_tensor.cc``): a decoupled call's ``ResponseIterator`` is owned by
    Python *and* by the stub's ``response_iterator_map_``. Once the last response arrives the iterator queues its id
    for clean-up, and the stub's stub-to-parent thread later erases the map entry without taking the GIL. If Python
    has already dropped the iterator and the responses, that erase releases them last: their output tensors free
    their numpy arrays (and a BYTES tensor's ``bytes`` objects) without the GIL, which corrupts the interpreter's
    heap; the stub then crashes later at a random place (segfaults in ``deserialize_bytes_tensor`` and in
    ``get_output_tensor_by_name`` under concurrent, cancelled streams; "BLS responses freed without the GIL",
    benchmarks/journal.md#2026-12-06-bls-hold). Holding them here for much longer than the clean-up takes (it is
    one message to the server process) makes Python's own release the last one.

    Args:
        delay_s: seconds an object is held (>= 0).
        clock: monotonic clock in seconds (tests pass a fake one).
    """

    def __init__(self, delay_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        if delay_s < 0:
            raise ValueError(f"delay_s: must be >= 0, got {delay_s}")
        self.delay_s = delay_s
        self._clock = clock
        self._held: collections.deque[tuple[float, Any]] = collections.deque()
        self._lock = threading.Lock()

    def hold(self, obj: Any) -> None:
        """Keep ``obj`` until ``delay_s`` seconds from now, and drop what is due."""
        now = self._clock()
        with self._lock:
            self._held.append((now + self.delay_s, obj))
        self.sweep(now)

    def sweep(self, now: float | None = None) -> int:
        """Drop the objects held past their time (outside the lock, in this thread); how many were dropped."""
        now = self._clock() if now is None else now
        due = []
        with self._lock:
            while self._held and self._held[0][0] <= now:
                due.append(self._held.popleft()[1])
        n = len(due)
        del due
        return n

    def release_all(self, settle_s: float = 0.5) -> int:
        """Drop everything held, once the newest object has been held ``settle_s`` seconds (sleeps at most that
        long, so that the stub's clean-up of the last calls is done); how many were dropped. For a model's
        ``finalize``: what is still held when the stub itself shuts down is freed after the stub's shared memory
        is gone, which crashes it (``tests/test_shutdown.py``)."""
        with self._lock:
            newest = self._held[-1][0] - self.delay_s if self._held else None
        if newest is not None:
            time.sleep(max(0.0, min(settle_s, newest + settle_s - self._clock())))
        return self.sweep(now=math.inf)

    def __len__(self) -> int:
        return len(self._held)


HOLD_ENV = "LOOKAHEAD_BLS_HOLD_S"


def hold_seconds(environ: Mapping[str, str] = os.environ) -> float:
    """How long BLS responses are held (:class:`DeferredRelease`): ``$LOOKAHEAD_BLS_HOLD_S`` seconds, default 30
    (0 reproduces python_backend's crash; see benchmarks/journal.md#2026-12-06-bls-hold).

    Raises:
        ValueError: the variable is not a finite number >= 0 (the message names it).
    """
    raw = environ.get(HOLD_ENV, "30")
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError(f"{HOLD_ENV}: must be a finite number of seconds >= 0, got {raw!r}")
    return value


_HELD = DeferredRelease(hold_seconds())


def release_held() -> int:
    """Drop every BLS response still held (:meth:`DeferredRelease.release_all`); the orchestrator's ``finalize``
    calls it. Returns how many calls' responses were dropped."""
    return _HELD.release_all()


def _exec_all(req) -> list:
    """Run one decoupled BLS request to completion in the calling (worker) thread: every response, in order. The
    iterator and the responses are also handed to :data:`_HELD` (see :class:`DeferredRelease`), also when the
    caller was cancelled meanwhile."""
    iterator = req.exec(decoupled=True)
    responses = list(iterator)
    _HELD.hold((iterator, responses))
    return responses


_STUB_SCAN: dict[int, tuple[float, dict[str, frozenset[int]]]] = {}
_MODEL_PY = re.compile(r"/([^/]+)/\d+/model\.py$")


def proc_stat(pid_dir: Path) -> list[str]:
    """The fields of ``<pid_dir>/stat`` (Linux ``/proc/<pid>``) after the command name in parentheses:
    ``[state, ppid, pgrp, ...]`` (proc(5)).

    Raises:
        OSError: the process is gone or unreadable; IndexError: not a stat line.
    """
    return (pid_dir / "stat").read_text().rsplit(")", 1)[1].split()


def is_child(pid: int, parent: int | None = None) -> bool:
    """Process ``pid`` exists, is not a zombie and is a child of ``parent`` (default: this process's parent, for a
    caller inside a stub). Linux ``/proc`` (proc(5)); False elsewhere."""
    try:
        state, ppid = proc_stat(Path("/proc") / str(pid))[:2]
        return state != "Z" and int(ppid) == (os.getppid() if parent is None else parent)
    except (OSError, IndexError, ValueError):
        return False


def python_stubs(server_pid: int | None = None, max_age_s: float = 0.5) -> dict[str, frozenset[int]]:
    """Live (not zombie) Python-backend stub processes that the ``tritonserver`` process ``server_pid`` (default:
    this process's parent, for a caller inside a stub) started, by model name: the ``triton_python_backend_stub``
    children whose command line holds ``<repository>/<model>/<version>/model.py``. Linux ``/proc``; empty elsewhere.
    One scan serves every caller for ``max_age_s`` seconds."""
    parent = os.getppid() if server_pid is None else server_pid
    now = time.monotonic()
    cached = _STUB_SCAN.get(parent)
    if cached is not None and now - cached[0] < max_age_s:
        return cached[1]
    found: dict[str, set[int]] = {}
    for d in Path("/proc").glob("[0-9]*"):
        if not is_child(int(d.name), parent):
            continue
        try:
            args = (d / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "triton_python_backend_stub" not in args[0]:
            continue
        for a in args[1:]:
            m = _MODEL_PY.search(a)
            if m:
                found.setdefault(m.group(1), set()).add(int(d.name))
                break
    out = {k: frozenset(v) for k, v in found.items()}
    _STUB_SCAN[parent] = (now, out)
    return out


def role_stub_pids(model_name: str, server_pid: int | None = None, max_age_s: float = 0.5) -> frozenset[int]:
    """The live stub processes of model ``model_name`` (:func:`python_stubs`)."""
    return python_stubs(server_pid, max_age_s).get(model_name, frozenset())


class TritonBLSEngine(TokenizerAccess):
    """The Engine interface over a Triton role model, from inside the server.

    Args:
        model_name: the role model's name in the repository.
        checkpoint: local checkpoint folder (tokenizer, config) of the model the role serves.
        timeout_s: per-call timeout passed to Triton (None: no timeout).
        executor: threads that run the blocking BLS calls (None: the event loop's default executor, which asyncio
            sizes min(32, cores + 4)).
        supports_stop_count: the role model's engine honours ``GenerationRequest.stop_count > 1`` (the portable
            engine does); otherwise such requests are refused here.
        watch_interval_s: while a call is in flight, how often the role model's stub processes are checked
            (:func:`role_stub_pids`). A stub that dies mid-request never answers its decoupled requests (the BLS
            response iterator would wait forever), so a call whose stub is gone fails with ``RuntimeError`` within
            about this interval. Its worker thread stays blocked in Triton's iterator (one per such call).

    Raises:
        ImportError: outside a Triton Python-backend process (``triton_python_backend_utils`` missing).
    """

    name = "triton-bls"

    def __init__(self, model_name: str, checkpoint: str, timeout_s: float | None = None,
                 executor: Executor | None = None, supports_stop_count: bool = False,
                 watch_interval_s: float = 1.0) -> None:
        import triton_python_backend_utils as pb_utils  # noqa: F401 - fails clearly outside Triton

        self._pb = pb_utils
        self.model_name = model_name
        self.timeout_s = timeout_s
        self.executor = executor
        self.supports_stop_count = supports_stop_count
        self.watch_interval_s = watch_interval_s
        self._load_tokenizer(checkpoint)
        self.in_flight = 0

    @property
    def active_sequences(self) -> int:
        """Sequences this process currently has in flight on the role model (a load signal)."""
        return self.in_flight

    async def agenerate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """One BLS call per group of requests sharing stop strings and SD settings.

        Raises:
            RuntimeError: the role model answered with an error (its message is kept).
        """
        pb = self._pb
        for r in requests:
            check_stop_fields(r, multi_stop=self.supports_stop_count)
        groups: dict[tuple, list[int]] = {}
        for i, r in enumerate(requests):
            groups.setdefault((r.stop, r.spec, r.stop_count, r.max_tokens_per_stop), []).append(i)
        out: list[GenerationResult | None] = [None] * len(requests)
        self.in_flight += len(requests)
        try:
            for idx in groups.values():
                arrays = requests_to_arrays([requests[i] for i in idx])
                inputs = [pb.Tensor(name, arr) for name, arr in arrays.items()]
                kwargs = {}
                params = internal_parameters()
                if params:
                    kwargs["parameters"] = params
                if self.timeout_s:
                    kwargs["timeout"] = int(self.timeout_s * 1e6)  # microseconds
                req = pb.InferenceRequest(model_name=self.model_name, inputs=inputs,
                                          requested_output_names=OUTPUTS, **kwargs)
                call = asyncio.get_running_loop().run_in_executor(self.executor, _exec_all, req)
                responses = await self._watched(call)
                got = None
                for resp in responses:
                    if resp.has_error():
                        raise RuntimeError(f"{self.model_name}: {resp.error().message()}")
                    if resp.output_tensors():
                        got = resp
                if got is None:
                    raise RuntimeError(f"{self.model_name}: no response")

                def get(name, resp=got):
                    t = pb.get_output_tensor_by_name(resp, name)
                    return None if t is None else t.as_numpy()

                for i, res in zip(idx, arrays_to_results(get), strict=False):
                    out[i] = res
        finally:
            self.in_flight -= len(requests)
        return out  # type: ignore[return-value]

    async def _watched(self, call: asyncio.Future) -> list:
        """``call``'s result, or ``RuntimeError`` once a stub process of the role model that was alive during the
        call has died (see ``watch_interval_s``)."""
        watched: frozenset[int] = frozenset()
        while True:
            done, _ = await asyncio.wait({call}, timeout=self.watch_interval_s)
            if done:
                return call.result()
            live = role_stub_pids(self.model_name)
            dead = {p for p in watched - live if not is_child(p)}  # gone, not merely missed by the scan
            if dead:
                raise RuntimeError(f"{self.model_name}: the role model's process (pid {min(dead)}) died during the "
                                   "call; Triton starts a new one for the next request")
            watched = watched or live

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        raise RuntimeError("TritonBLSEngine is asynchronous only (use agenerate inside async execute)")

    def close(self) -> None:
        pass
