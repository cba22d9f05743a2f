"""Start a real Triton Inference Server for a profile (``lookahead-reasoning serve``).

The server binary comes from the ``nvidia-pytriton`` wheel (Triton 2.51 with the Python backend; recipe in
docs/triton_on_cpu.md): the Python backend stub for the running Python is copied next to the backend
library if missing, the virtual environment's ``bin`` goes first on ``PATH`` so models import this package,
and every port binds to ``host`` (127.0.0.1 unless told otherwise).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from ..backends.role_tensors import INTERNAL_KEY_ENV
from ..backends.triton_bls import is_child, proc_stat, python_stubs
from .model_repository import render_repository


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port the OS reports free on ``host`` right now (another process may still take it before use)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def check_ports_free(host: str, ports: dict[str, int]) -> None:
    """Raise ``ValueError`` naming the option (a key of ``ports``) whose port another process already listens
    on, or two options given the same port: the new server could not bind it, and a health check would be
    answered by the other one. Options whose port is None (not served) are skipped."""
    ports = {k: v for k, v in ports.items() if v is not None}
    seen: dict[int, str] = {}
    for name, port in ports.items():
        if port in seen:
            raise ValueError(f"{name}: port {port} is also given to {seen[port]}")
        seen[port] = name
    for name, port in ports.items():
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError as exc:
                raise ValueError(f"{name}: {host}:{port} is already in use ({exc.strerror})") from None


def triton_install() -> tuple[Path, Path]:
    """``(tritonserver binary, backends directory)`` from the installed ``nvidia-pytriton`` wheel.

    Raises:
        ImportError: ``nvidia-pytriton`` is not installed (``pip install '.[serve]'``).
        FileNotFoundError: the wheel lacks the server or the stub for this Python.
    """
    try:
        import pytriton
    except ImportError as exc:
        raise ImportError("serve needs nvidia-pytriton: pip install '.[serve]'") from exc
    root = Path(pytriton.__file__).resolve().parent / "tritonserver"
    binary, backends = root / "bin" / "tritonserver", root / "backends"
    if not binary.exists():
        raise FileNotFoundError(f"tritonserver not found at {binary}")
    stub = backends / "python" / "triton_python_backend_stub"
    if not stub.exists():
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        src = root / "python_backend_stubs" / version / "triton_python_backend_stub"
        if not src.exists():
            raise FileNotFoundError(f"no Triton Python backend stub for Python {version} in {root}")
        shutil.copy2(src, stub)
    return binary, backends


LOG_LEVELS = ("error", "warning", "info", "verbose")


def log_flags(level: str, verbose: int = 0) -> list[str]:
    """tritonserver flags for a log level: messages of that severity and above (``verbose`` adds Triton's verbose
    log, level ``max(1, verbose)``)."""
    if level not in LOG_LEVELS:
        raise ValueError(f"--log-level: one of {', '.join(LOG_LEVELS)}, got {level!r}")
    rank = LOG_LEVELS.index(level)
    return ["--log-error", "true", "--log-warning", str(rank >= 1).lower(), "--log-info", str(rank >= 2).lower(),
            "--log-verbose", str(max(1, verbose) if rank == 3 else verbose)]


@dataclass
class ServerConfig:
    """Ports, bind address and model repository of one server."""

    model_repository: Path
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    model_control_mode: str = "explicit"  # every model loaded at start; "none" disables restart_dead_models
    log_verbose: int = 0
    # error | warning | info | verbose (Triton's --log-error/--log-warning/--log-info/--log-verbose)
    log_level: str = "info"
    extra_args: list[str] = field(default_factory=list)
    # role models answer only the orchestrator's BLS calls (role_tensors.INTERNAL_KEY_ENV)
    guard_role_models: bool = True
    # Reload a model whose Python-backend process died: Triton 2.51 neither restarts it nor stops reporting the model
    # ready, and answers every later request with "Stub process ... is not healthy" (explicit control mode only)
    restart_dead_models: bool = True
    watch_interval_s: float = 1.0


class TritonServer:
    """A running ``tritonserver`` process (context manager: starts, waits until ready, stops).

    Raises:
        RuntimeError: the server exited or did not become ready within ``ready_timeout_s``.
    """

    def __init__(self, config: ServerConfig, ready_timeout_s: float = 240.0, log_path: str | Path | None = None,
                 log_to_stderr: bool = False):
        """``log_path``: append Triton's log (and the models' access log) there; else to this process's stderr when
        ``log_to_stderr`` (``serve``), else nowhere (library use, tests pass a path)."""
        self.config = config
        self.log_to_stderr = log_to_stderr
        self.ready_timeout_s = ready_timeout_s
        self.log_path = Path(log_path) if log_path else None
        self.proc: subprocess.Popen | None = None
        self.restarts: list[tuple[float, str]] = []  # (time.time(), model) of each reload of a dead model
        self._stopping = threading.Event()

    @property
    def http_url(self) -> str:
        return f"{self.config.host}:{self.config.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.config.host}:{self.config.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"{self.config.host}:{self.config.metrics_port}"

    def command(self) -> list[str]:
        binary, backends = triton_install()
        c = self.config
        cmd = [
            str(binary), "--model-repository", str(c.model_repository), "--backend-directory", str(backends),
            "--http-address", c.host, "--http-port", str(c.http_port),
            "--grpc-address", c.host, "--grpc-port", str(c.grpc_port),
            "--metrics-address", c.host, "--metrics-port", str(c.metrics_port),
            "--allow-metrics", "true", *log_flags(c.log_level, c.log_verbose),
            "--model-control-mode", c.model_control_mode,
        ]
        if c.model_control_mode == "explicit":
            cmd += ["--load-model", "*"]
        return cmd + list(c.extra_args)

    def start(self) -> TritonServer:
        """Start the process and wait until it is ready.

        Raises:
            ValueError: a port is already in use (named). RuntimeError: see the class.
        """
        c = self.config
        check_ports_free(c.host, {"http_port": c.http_port, "grpc_port": c.grpc_port, "metrics_port": c.metrics_port})
        env = dict(os.environ)
        env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("TRANSFORMERS_OFFLINE", "1")
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        env.pop(INTERNAL_KEY_ENV, None)
        if c.guard_role_models:  # a fresh secret per server: only its own processes can call the role models
            env[INTERNAL_KEY_ENV] = secrets.token_hex(16)
        out = open(self.log_path, "ab") if self.log_path else (None if self.log_to_stderr else subprocess.DEVNULL)
        self.proc = subprocess.Popen(self.command(), env=env, stdout=out or sys.stderr.fileno(),
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_ready()
        if c.restart_dead_models and c.model_control_mode == "explicit":
            threading.Thread(target=self._supervise, name="triton-supervisor", daemon=True).start()
        return self

    def _supervise(self) -> None:
        """Every ``watch_interval_s``: a model whose stub processes seen at the last look are all gone now (no such
        pid, or a zombie), that has no live stub in a fresh scan and that Triton still reports ready died (an unload
        by a client first makes it not ready); unload it, so that health reports it, and load it again with a fresh
        process. Logs each restart to stderr and records it in :attr:`restarts`. A model is never reloaded on a scan
        that merely missed its stub: the pids it had must be gone."""
        pid = self.proc.pid if self.proc is not None else None
        seen = python_stubs(pid, max_age_s=0) if pid is not None else {}
        while not self._stopping.wait(self.config.watch_interval_s):
            if self.proc is None or self.proc.poll() is not None:
                return
            stubs = python_stubs(pid, max_age_s=0)
            reloaded = {}
            for model in seen.keys() - stubs.keys():
                if any(is_child(p, pid) for p in seen[model]):
                    stubs = {**stubs, model: seen[model]}  # the scan missed a live stub: keep watching it
                    continue
                if self._request("GET", f"/v2/models/{model}/ready") != 200:
                    continue  # unloaded or loading: not a death
                if model in python_stubs(pid, max_age_s=0):
                    continue  # a new process appeared meanwhile
                print(f"lookahead-reasoning: the process of model {model!r} (pid {min(seen[model])}) died; "
                      "reloading it", file=sys.stderr, flush=True)
                self._request("POST", f"/v2/repository/models/{model}/unload")
                code = self._request("POST", f"/v2/repository/models/{model}/load", timeout=self.ready_timeout_s)
                self.restarts.append((time.time(), model))
                if code == 200:
                    reloaded[model] = python_stubs(pid, max_age_s=0).get(model, frozenset())
                else:
                    print(f"lookahead-reasoning: reloading {model!r} failed (HTTP {code})", file=sys.stderr, flush=True)
            seen = {**stubs, **{m: p for m, p in reloaded.items() if p}}  # a reloaded model is watched from now on

    def _request(self, method: str, path: str, timeout: float = 10.0) -> int | None:
        """HTTP status of one call to this server's HTTP endpoint (None: no answer)."""
        req = urllib.request.Request(f"http://{self.http_url}{path}", method=method,
                                     data=b"{}" if method == "POST" else None)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except (urllib.error.URLError, OSError):
            return None

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        url = f"http://{self.http_url}/v2/health/ready"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tritonserver exited with status {self.proc.returncode}"
                                   + (f" (log: {self.log_path})" if self.log_path else ""))
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"tritonserver not ready after {self.ready_timeout_s:.0f} s"
                           + (f" (log: {self.log_path})" if self.log_path else ""))

    def engine_dtypes(self) -> dict[str, str]:
        """``{role: dtype}`` of the role models' engines, read from the ``lookahead_engine_dtype_info`` metric
        ({} if the metrics endpoint does not answer)."""
        import re

        try:
            with urllib.request.urlopen(f"http://{self.metrics_url}/metrics", timeout=5) as r:
                text = r.read().decode()
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return {}
        found = {}
        for labels in re.findall(r'^lookahead_engine_dtype_info\{([^}]*)\}', text, re.M):
            kv = dict(re.findall(r'(\w+)="([^"]*)"', labels))
            if "role" in kv and "dtype" in kv:
                found[kv["role"]] = kv["dtype"]
        return found

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM, then SIGKILL of the whole process group after ``timeout_s`` (Triton's own exit timeout is 30 s;
        see README, "Known limitation"); then remove the shared-memory segments the server's processes had mapped
        (a killed Python-backend stub leaves its ``/dev/shm`` region behind)."""
        if self.proc is None:
            return
        self._stopping.set()
        owned = shm_segments_of(self.proc.pid)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                pass
        try:  # stubs that outlive tritonserver (it was killed, or timed out) go with their process group
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self.proc.poll() is None:
            self.proc.wait(timeout=10)
        for path in owned:
            Path(path).unlink(missing_ok=True)

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


OWNER_FILE = "owner.pid"  # in a temporary model repository: the pid of the ``serve`` that made it


def _mapped_shm(pid_dir: Path) -> set[str]:
    try:
        maps = (pid_dir / "maps").read_text()
    except OSError:
        return set()
    return {line.split(None, 5)[5].replace(" (deleted)", "").strip() for line in maps.splitlines()
            if " /dev/shm/" in line}


def shm_segments_of(pgid: int) -> set[str]:
    """``/dev/shm`` files mapped by the processes of process group ``pgid`` (Linux ``/proc``; empty elsewhere)."""
    out: set[str] = set()
    for d in Path("/proc").glob("[0-9]*"):
        try:
            if int(proc_stat(d)[2]) == pgid:
                out |= _mapped_shm(d)
        except (OSError, ValueError, IndexError):
            continue
    return out


def remove_stale_repositories() -> list[Path]:
    """Temporary model repositories (``lr-triton-*`` with an :data:`OWNER_FILE`) whose ``serve`` process is gone:
    what a ``serve`` killed outright left. Returns what it removed. (Shared-memory segments are removed only by
    their own server's :meth:`TritonServer.stop`, which knows them from its processes' mappings: a segment that no
    process maps cannot be told apart, from outside, from one a live server will open again.)"""
    removed: list[Path] = []
    for repo in Path(tempfile.gettempdir()).glob("lr-triton-*"):
        try:
            owner = int((repo / OWNER_FILE).read_text().strip())
        except (OSError, ValueError):
            continue
        if not Path(f"/proc/{owner}").exists():
            shutil.rmtree(repo, ignore_errors=True)
            removed.append(repo)
    return removed


def prepare_repository(profile_name: str | None, profile_config: str | None, model_repository: str | None,
                       limits: dict[str, str] | None = None, threads: dict[str, int] | None = None,
                       reasoning_parser: str | None = None) -> Path:
    """Render the repository for a profile (into ``model_repository`` or a fresh temporary folder).
    ``reasoning_parser`` overrides the profile's (what the OpenAI front splits answers with).

    Threads: one torch thread per role model process by default, so draft, target and judge together do not
    oversubscribe a 2-core machine.
    """
    from ..profiles import load_profile

    profile = load_profile(profile_name, profile_config)
    roles = tuple(r for r in ("draft", "target", "judge") if getattr(profile, r) is not None)
    out = Path(model_repository) if model_repository else Path(tempfile.mkdtemp(prefix="lr-triton-"))
    if not model_repository:  # a temporary repository: who owns it (see remove_stale_repositories)
        (out / OWNER_FILE).write_text(str(os.getpid()))
    threads = threads or {r: getattr(profile, r).num_threads or 1 for r in roles}
    cfg = str(Path(profile_config).resolve()) if profile_config else None
    # the OpenAI-compatible front reads the reasoning parser from the model configuration (GET .../config)
    limits = {**(limits or {}), "reasoning_parser": reasoning_parser or profile.reasoning_parser}
    return render_repository(out, profile.name, cfg, roles, threads, limits)


def serve_forever(server: TritonServer, openai_port: int | None = None) -> int:
    """Run until SIGINT/SIGTERM, then shut the server (and the OpenAI-compatible front) down cleanly."""
    stop = {"flag": False}

    def handler(signum, frame):
        stop["flag"] = True

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    front = None
    try:
        server.start()
        dtypes = ", ".join(f"{role} {dt}" for role, dt in sorted(server.engine_dtypes().items()))
        print(f"Triton ready: http {server.http_url}  grpc {server.grpc_url}  "
              f"metrics {server.config.host}:{server.config.metrics_port}"
              + (f"  engines: {dtypes}" if dtypes else ""), flush=True)
        if openai_port:
            from .openai_front import start_front

            front = start_front(server.grpc_url, server.config.host, openai_port)
            print(f"OpenAI-compatible front: http://{server.config.host}:{openai_port}/v1", flush=True)
        while not stop["flag"] and server.proc.poll() is None:
            time.sleep(0.2)
        if stop["flag"]:
            return 0
        rc = server.proc.returncode
        why = f"killed by signal {-rc}" if rc < 0 else f"exit status {rc}"
        where = f"its log: {server.log_path}" if server.log_path else "its log is above"
        print(f"tritonserver stopped on its own ({why}); {where}", file=sys.stderr, flush=True)
        return 1
    finally:
        if front is not None:
            front.stop()
        server.stop()
