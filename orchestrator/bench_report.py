"""Plots (PNG, matplotlib Agg) and the markdown summary of a ``bench`` report (see :mod:`.bench`)."""

from __future__ import annotations

import datetime as _dt
import json
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


def _load_key(run: dict) -> str:
    return "concurrency" if "concurrency" in run else "request_rate"


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_bench(doc: dict, folder: str | Path) -> list[Path]:
    """Write ``latency_cdf.png`` (TTFT, TPOT, E2E CDFs per mode and load) and ``goodput_speedup.png``
    (goodput, or requests/s without SLOs, and speedup vs ``ar`` against load). Returns the paths."""
    plt = _plt()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    runs = doc["runs"]
    modes = list(dict.fromkeys(r["mode"] for r in runs))
    loads = list(dict.fromkeys(r[_load_key(r)] for r in runs))
    styles = ["-", "--", ":", "-."]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, (metric, label) in zip(axes, (("ttft", "TTFT (ms)"), ("tpot", "TPOT (ms/token)"), ("e2e", "E2E latency (ms)"))):
        for r in runs:
            vals = sorted(v for v in r.get("samples_ms", {}).get(metric, []) if v is not None)
            if not vals:
                continue
            li = loads.index(r[_load_key(r)])
            ax.ecdf(vals, color=f"C{modes.index(r['mode'])}", linestyle=styles[li % len(styles)],
                    label=f"{r['mode']} {_load_key(r).replace('_', ' ')}={r[_load_key(r)]}")
        ax.set_xlabel(label)
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle("Latency CDF per mode")
    fig.tight_layout()
    cdf = folder / "latency_cdf.png"
    fig.savefig(cdf, dpi=120)
    plt.close(fig)

    key = _load_key(runs[0]) if runs else "concurrency"
    has_slo = any(r.get("goodput_rps") is not None for r in runs)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, mode in enumerate(modes):
        rs = [r for r in runs if r["mode"] == mode]
        xs = [r[key] for r in rs]
        a1.plot(xs, [r["goodput_rps"] if has_slo else r["requests_per_s"] for r in rs], "o-", color=f"C{i}", label=mode)
        sp = [(r[key], r["speedup_vs_ar"]) for r in rs if r.get("speedup_vs_ar") is not None]
        if mode != "ar" and sp:
            a2.plot(*zip(*sp), "o-", color=f"C{i}", label=mode)
    a1.set_ylabel("goodput (requests/s meeting all SLOs)" if has_slo else "requests/s (no SLO given)")
    a2.set_ylabel("speedup vs ar (output tokens/s)")
    a2.axhline(1.0, color="gray", linewidth=0.8)
    for ax in (a1, a2):
        ax.set_xlabel(key.replace("_", " "))
        if key == "concurrency":
            ax.set_xscale("log", base=2)
            ax.set_xticks(loads, [str(x) for x in loads])
            ax.minorticks_off()
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.tight_layout()
    gs = folder / "goodput_speedup.png"
    fig.savefig(gs, dpi=120)
    plt.close(fig)
    return [cdf, gs]


def _f(x, digits: int = 1) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def summary_table(doc: dict) -> str:
    """The markdown table of a bench report: one row per mode and load."""
    head = ("| mode | load | TTFT p50/p90/p99 ms | ITL p50/p99 ms | TPOT p50/p99 ms | E2E p50/p90/p99 ms "
            "| out tok/s | req/s | goodput req/s | speedup vs ar | failed |")
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in doc["runs"]:
        key = _load_key(r)
        t, i, p, e = r["ttft_ms"], r["itl_ms"], r["tpot_ms"], r["e2e_ms"]
        rows.append(
            f"| {r['mode']} | {'c' if key == 'concurrency' else 'rate'}={r[key]} "
            f"| {_f(t['p50'])} / {_f(t['p90'])} / {_f(t['p99'])} | {_f(i['p50'])} / {_f(i['p99'])} "
            f"| {_f(p['p50'], 2)} / {_f(p['p99'], 2)} | {_f(e['p50'], 0)} / {_f(e['p90'], 0)} / {_f(e['p99'], 0)} "
            f"| {_f(r['output_tokens_per_s'])} | {_f(r['requests_per_s'], 3)} | {_f(r['goodput_rps'], 3)} "
            f"| {_f(r.get('speedup_vs_ar'), 2)} | {r.get('failed', 0)} |")
    return "\n".join(rows)


def write_summary(doc: dict, path: str | Path, plots: list[Path] | None = None) -> Path:
    """Markdown: date, machine, command, dataset, SLOs, how it was measured (``doc["measurement"]``: warm-up,
    order, load averages, a load warning), server profile, the table, the plots."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    m = doc.get("machine", {})
    slo = doc.get("slo_ms")
    lines = [
        "# Latency-SLA benchmark", "",
        f"- date: {doc.get('date', 'n/a')}",
        f"- machine: {m.get('cpu', 'n/a')} x{m.get('cpus', '?')}; GPUs: {', '.join(m.get('gpus') or []) or 'none'}",
        f"- command: `{doc.get('command', '')}`",
        f"- dataset: {doc.get('dataset', 'n/a')}; {doc.get('requests_per_run', '?')} requests per mode and load",
        f"- SLO: {', '.join(f'{k} <= {v:g}' for k, v in slo.items()) if slo else 'none (goodput n/a)'}",
        *measurement_lines(doc.get("measurement")),
        "- percentiles: numpy.percentile (linear interpolation); ITL is per streamed chunk (LR streams whole steps);"
        " TPOT = (E2E - TTFT) / (output tokens - 1); definitions as vLLM benchmark_serving",
        "", summary_table(doc), "",
    ]
    if doc.get("server_profile") is not None:
        lines += ["<details><summary>server profile</summary>", "", "```json",
                  json.dumps(doc["server_profile"], indent=2, default=str), "```", "</details>", ""]
    for p in plots or []:
        lines.append(f"![{p.stem}]({os.path.relpath(p, path.parent)})")
    path.write_text("\n".join(lines) + "\n")
    return path
