"""HumanEval programs run in a limited subprocess: pass, fail, timeout, memory limit, no reach into the parent."""

from __future__ import annotations

import os
import signal
import textwrap

from lookahead_reasoning.evaluation.answers import check_answer, load_items
from lookahead_reasoning.evaluation.sandbox import check_humaneval, humaneval_program, run_python

ITEM = load_items("humaneval", 1)[0]  # has_close_elements
BODY = """\
    for i, a in enumerate(numbers):
        for j, b in enumerate(numbers):
            if i != j and abs(a - b) < threshold:
                return True
    return False
"""


def test_passing_and_failing_humaneval_programs():
    assert check_humaneval(ITEM, BODY).status == "passed"
    assert check_answer(ITEM, BODY) is True
    wrong = check_humaneval(ITEM, "    return False\n")
    assert wrong.status == "failed" and "AssertionError" in wrong.stderr_tail
    # a chat answer: the whole function in a fenced block, with prose around it
    fenced = f"Sure!\n```python\ndef has_close_elements(numbers, threshold):\n{BODY}```\nThis works."
    assert check_humaneval(ITEM, fenced).passed
    # a plain completion running on into another top-level function is cut at "\ndef " (Codex stops)
    assert check_humaneval(ITEM, BODY + "\n\ndef broken(:\n").passed
    assert "check(has_close_elements)" in humaneval_program(ITEM, BODY)


def test_infinite_loop_killed_by_wall_clock_timeout():
    res = run_python("while True:\n    pass\n", timeout_s=1.0, cpu_s=30)
    assert res.status == "timeout" and res.seconds < 5


def test_cpu_limit_kills_busy_loop():
    res = run_python("while True:\n    pass\n", timeout_s=20.0, cpu_s=1)
    assert res.status == "timeout" and res.returncode in (-signal.SIGXCPU, -signal.SIGKILL) and res.seconds < 10


def test_memory_hog_killed_by_address_space_limit():
    res = run_python("x = bytearray(2 * 1024 ** 3)\nprint(len(x))\n", memory_mb=256)
    assert res.status == "memory" and not res.passed


def test_model_code_cannot_touch_the_parent(tmp_path):
    hits = []
    old = signal.signal(signal.SIGUSR1, lambda *a: hits.append(1))
    outside = tmp_path / "pwned.txt"
    try:
        program = textwrap.dedent(f"""
            import os, sys, builtins
            builtins.SANDBOX_MARK = 1          # only the child's interpreter
            os.environ["SANDBOX_MARK"] = "1"   # only the child's environment
            open("inside.txt", "w").write("ok")  # its own temporary directory is writable
            blocked = []
            for attempt in (lambda: os.kill(os.getppid(), {int(signal.SIGUSR1)}),
                            lambda: open({str(outside)!r}, "w"),
                            lambda: os.system("true"),
                            lambda: __import__("subprocess").run(["true"]),
                            lambda: __import__("ctypes").CDLL(None)):
                try:
                    attempt()
                except PermissionError:
                    blocked.append(1)
            assert len(blocked) == 5, blocked
            assert "HOME" not in os.environ or os.environ["HOME"] == os.getcwd()
            assert not any(k.startswith(("OPENAI", "HF_", "AWS")) for k in os.environ)
        """)
        res = run_python(program, timeout_s=10)
        assert res.passed, res.stderr_tail
    finally:
        signal.signal(signal.SIGUSR1, old)
    assert hits == []  # no signal reached this process
    assert not outside.exists()
    assert not hasattr(__import__("builtins"), "SANDBOX_MARK") and "SANDBOX_MARK" not in os.environ
