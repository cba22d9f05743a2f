"""Component faults injected for real (Triton model control API, a role model's process killed with SIGKILL, a
judge timeout below the judge's latency), limits, and the bind address.

The server runs the demo trio (whose draft writes whole steps, so the judge is really called) in explicit
model-control mode with ``judge_timeout_s`` far below the judge's real latency and ``max_concurrency`` 2.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

import pytest
import tritonclient.http as httpclient
from conftest import STOP_GRACE_S, scrape, start_server
from lookahead_reasoning.backends.triton_bls import role_stub_pids
from lookahead_reasoning.evaluation.synthetic import EVAL_SEED, generate_problems
from lookahead_reasoning.serving.client import ServerError, TritonLRClient

pytestmark = pytest.mark.server
# a held-out demo problem whose answer has several steps (longer than the token budgets below)
PROMPT = next(p.question for p in generate_problems(40, EVAL_SEED) if len(p.steps) >= 4)


@pytest.fixture(scope="module")
def fault_server(tmp_path_factory):
    server = start_server(tmp_path_factory, None, control="explicit", profile="demo", judge_timeout_s="0.0002",
                          max_concurrency="2")
    yield server
    server.stop(STOP_GRACE_S)


def _client(server):
    # a request here takes seconds; one that hangs (a stub that died mid-request never answers) fails in 2 minutes
    return TritonLRClient(server.grpc_url, "grpc", timeout_s=120)


def _run(coro):
    return asyncio.run(coro)


def _control(server):
    """Triton's HTTP client for model control, closed after use (``contextlib.closing``): an open keep-alive
    connection holds tritonserver's exit for its whole 30-s exit timeout."""
    return contextlib.closing(httpclient.InferenceServerClient(server.http_url))


def test_slow_judge_rejects_drafts_and_keeps_target_steps(fault_server):
    before = scrape(fault_server).get('lookahead_judge_fallbacks_total{mode="lr+sd"}', 0.0)
    ar = _run(_client(fault_server).generate(PROMPT, mode="ar", max_tokens=40))
    lr = _run(_client(fault_server).generate(PROMPT, mode="lr+sd", judge="llm", max_tokens=40))
    assert lr.metrics["fallbacks"] >= 1
    if lr.metrics["accepted_steps"] == 0:  # (a batch of pairs that all match after normalization skips the judge)
        assert lr.text == ar.text  # every draft rejected, the target's own steps kept (greedy)
    assert scrape(fault_server)['lookahead_judge_fallbacks_total{mode="lr+sd"}'] > before


def test_unloaded_judge_falls_back(fault_server):
    with _control(fault_server) as ctl:
        ctl.unload_model("judge")
        try:
            ar = _run(_client(fault_server).generate(PROMPT, mode="ar", max_tokens=120))
            res = _run(_client(fault_server).generate(PROMPT, mode="lr", judge="llm", max_tokens=120))
            # drafts identical to the target's step skip the judge; the others reach the missing judge and fall back
            assert res.metrics["fallbacks"] >= 1
            assert res.text == ar.text  # every judged draft rejected, so the target's own steps (greedy) are kept
        finally:
            ctl.load_model("judge")
        assert ctl.is_model_ready("judge")


def test_draft_unloaded_mid_run_continues_target_only(fault_server):
    client = _client(fault_server)
    ar = _run(client.generate(PROMPT, mode="ar", max_tokens=240))  # several cycles after the first step

    async def go():
        chunks = []
        async for c in client.stream(PROMPT, mode="lr", judge="exact", max_tokens=240):
            chunks.append(c)
            if len(chunks) == 1:
                # a client of its own in the worker thread (the HTTP client's greenlets are bound to a thread)
                def unload():
                    with _control(fault_server) as ctl:
                        ctl.unload_model("draft")
                await asyncio.to_thread(unload)
        return chunks

    try:
        chunks = _run(go())
    finally:
        with _control(fault_server) as ctl:
            ctl.load_model("draft")
    final = chunks[-1].metrics
    assert final["draft_failures"] >= 1
    # exact judge + greedy is lossless, so the text equals ar whether a step came from the draft before the fault
    # or from the target after it (a semantic judge may keep a draft wording and differ from ar legitimately)
    assert "".join(c.text for c in chunks) == ar.text
    assert final["generated_tokens"] == ar.metrics["generated_tokens"]


def test_failing_target_is_a_clear_error(fault_server):
    with _control(fault_server) as ctl:
        ctl.unload_model("target")
        try:
            with pytest.raises(ServerError, match="target"):
                _run(_client(fault_server).generate(PROMPT, mode="lr", max_tokens=16))
        finally:
            ctl.load_model("target")
    good = _run(_client(fault_server).generate(PROMPT, mode="lr", max_tokens=16))
    assert good.metrics["generated_tokens"] == 16


def _stub_pid(server, role: str) -> int:
    pids = role_stub_pids(role, server.proc.pid, max_age_s=0)
    assert len(pids) == 1, f"{role}: stub processes {sorted(pids)}"
    return next(iter(pids))


def _health_is_truthful(server) -> None:
    """Ready (server and every role model) exactly when a request is served again, within 60 s."""
    client = _client(server)
    deadline = time.monotonic() + 60
    with _control(server) as ctl:
        while True:
            ready = ctl.is_server_ready() and all(ctl.is_model_ready(m) for m in ("target", "draft", "judge"))
            try:
                served = _run(client.generate(PROMPT, mode="lr", max_tokens=16)).metrics["generated_tokens"] == 16
            except ServerError:
                served = False
            if ready == served and (served or time.monotonic() > deadline):
                return
            assert time.monotonic() < deadline, f"health says ready={ready}, a request served={served}"
            time.sleep(1)


def _kill_after_first_chunk(server, role: str, mode: str, judge: str = "exact", max_tokens: int = 500):
    """Stream one request and SIGKILL ``role``'s stub process once its first chunk arrived (bounded: 90 s)."""
    victim = _stub_pid(server, role)
    client = _client(server)

    async def go():
        chunks = []
        async for c in client.stream(PROMPT, mode=mode, judge=judge, max_tokens=max_tokens):
            chunks.append(c)
            if len(chunks) == 1:
                os.kill(victim, signal.SIGKILL)
        return chunks

    return victim, _run(asyncio.wait_for(go(), 90))


def test_killed_target_process_is_a_clear_error(fault_server):
    t0 = time.monotonic()
    with pytest.raises(ServerError, match="target") as err:
        _kill_after_first_chunk(fault_server, "target", "ar")
    assert time.monotonic() - t0 < 60
    assert "died" in str(err.value) or "stub process" in str(err.value).lower(), err.value
    _health_is_truthful(fault_server)
    assert _stub_pid(fault_server, "target")  # a new target process serves
    assert "target" in [m for _, m in fault_server.restarts]  # reloaded by the server's supervisor


def test_killed_draft_process_falls_back_to_target_only(fault_server):
    ar = _run(_client(fault_server).generate(PROMPT, mode="ar", max_tokens=240))
    victim, chunks = _kill_after_first_chunk(fault_server, "draft", "lr", max_tokens=240)
    final = chunks[-1].metrics
    assert final["draft_failures"] >= 1
    assert "".join(c.text for c in chunks) == ar.text  # exact judge + greedy: lossless before and after the fault
    _health_is_truthful(fault_server)
    assert _stub_pid(fault_server, "draft") != victim and "draft" in [m for _, m in fault_server.restarts]


def test_a_scan_that_misses_a_live_stub_reloads_nothing(fault_server, monkeypatch):
    # the supervisor's /proc scans miss the orchestrator's stub while the process lives: no death, no reload (a
    # reload would drop the requests in flight on it)
    from lookahead_reasoning.serving import server as server_mod

    real, restarts = server_mod.python_stubs, len(fault_server.restarts)
    pid = _stub_pid(fault_server, "lookahead_reasoning")
    monkeypatch.setattr(server_mod, "python_stubs", lambda *a, **k: {
        m: p for m, p in real(*a, **k).items() if m != "lookahead_reasoning"})
    time.sleep(4 * fault_server.config.watch_interval_s)
    monkeypatch.undo()
    assert fault_server.restarts[restarts:] == []
    assert _stub_pid(fault_server, "lookahead_reasoning") == pid


def test_concurrency_limit_is_enforced(fault_server):
    client = _client(fault_server)

    async def one():
        try:
            return await client.generate(PROMPT, mode="ar", max_tokens=400)
        except ServerError as exc:
            return exc

    async def go():
        return await asyncio.gather(*(one() for _ in range(4)))

    out = _run(go())
    refused = [x for x in out if isinstance(x, ServerError)]
    assert refused and all("busy" in str(x) for x in refused)
    assert any(not isinstance(x, ServerError) for x in out)
    time.sleep(0.5)
    assert _run(client.generate(PROMPT, max_tokens=8)).metrics["generated_tokens"] == 8


def _listening_addresses(port: int) -> set[str]:
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            addr, p = local.rsplit(":", 1)
            if int(p, 16) == port and state == "0A":  # LISTEN
                out.add(addr)
    return out


def test_every_port_binds_loopback(fault_server):
    cfg = fault_server.config
    assert cfg.host == "127.0.0.1"
    for port in (cfg.http_port, cfg.grpc_port, cfg.metrics_port):
        addrs = _listening_addresses(port)
        # 127.0.0.1 in /proc/net/tcp's little-endian hex, or its IPv4-mapped form ::ffff:127.0.0.1 in tcp6
        assert addrs and addrs <= {"0100007F", "0000000000000000FFFF00000100007F"}, (port, addrs)
