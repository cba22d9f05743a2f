"""Report helpers shared by ``eval`` (:mod:`.evaluation`) and ``bench`` (:mod:`.benchmarking`): the environment
block (date, machine, command), the measurement lines of a markdown summary, matplotlib's Agg backend and one plot
style per mode. Both folders import this module; it imports neither."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path


def environment() -> dict:
    """Date (UTC, ISO 8601), machine (host, OS, CPU model and count, GPUs from ``nvidia-smi -L``) and the
    command line, for reports."""
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    gpus: list[str] = []
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10).stdout
            gpus = [line.split(" (UUID")[0] for line in out.splitlines() if line.strip()]
        except (OSError, subprocess.SubprocessError):
            pass
    return {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "machine": {"host": platform.node(), "os": platform.platform(), "cpu": cpu, "cpus": os.cpu_count(),
                        "gpus": gpus},
            "command": "lookahead-reasoning " + " ".join(sys.argv[1:]) if sys.argv else ""}


def measurement_lines(meas: dict | None) -> list[str]:
    """Markdown bullet lines describing a ``measurement`` block (warm-up, order, prefix cache, bootstrap,
    load; see ``evaluation.measurement_block``), its warning first when it has one; [] for None."""
    if not meas:
        return []
    f = lambda x: "n/a" if x is None else f"{x:.2f}"  # noqa: E731
    lines = [f"- **warning: {meas['warning']}**"] if meas.get("warning") else []
    how = [f"{meas['warmup_requests_per_mode']} untimed warm-up request(s) per mode"
           if "warmup_requests_per_mode" in meas else None,
           f"order: {meas['order']}" if meas.get("order") else None,
           f"prefix cache {meas['prefix_cache']}" if meas.get("prefix_cache") else None,
           f"speedup intervals: 95% paired bootstrap over items, {meas['bootstrap_resamples']} resamples"
           if meas.get("bootstrap_resamples") else None]
    if any(how):
        lines.append("- measurement: " + "; ".join(h for h in how if h))
    lines.append(f"- 1-minute load average: {f(meas.get('load_avg_1min_start'))} at start, "
                 f"{f(meas.get('load_avg_1min_end'))} at end (includes this run), {meas.get('cpu_count')} cores")
    return lines


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (PNG files, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


#: One colour, line style and marker per mode, the same in every plot (matplotlib's tab10 colours).
MODE_STYLE = {"ar": ("tab:gray", "-", "o"), "sd": ("tab:blue", "--", "s"), "lr": ("tab:orange", ":", "^"),
              "lr+sd": ("tab:green", "-.", "D")}


def mode_style(mode: str) -> tuple[str, str, str]:
    """``(colour, line style, marker)`` of a mode; modes outside :data:`MODE_STYLE` get tab10's later colours."""
    if mode in MODE_STYLE:
        return MODE_STYLE[mode]
    extra = ["tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan"]
    return extra[sum(map(ord, mode)) % len(extra)], (0, (3, 1, 1, 1)), "v"


__all__ = ["environment", "measurement_lines", "pyplot", "MODE_STYLE", "mode_style"]
