"""Plots (PNG, matplotlib Agg) and the markdown summary of a ``bench`` report (see :mod:`.bench`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..reporting import measurement_lines, mode_style, pyplot


def _load_key(run: dict) -> str:
    return "concurrency" if "concurrency" in run else "request_rate"


#: The four latency panels of the bench plots: (metric key, axis label).
_PANELS = (("ttft", "TTFT (ms)"), ("itl", "ITL per streamed chunk (ms)"), ("tpot", "TPOT (ms/token)"),
           ("e2e", "E2E latency (ms)"))


def _load_axis(ax, key: str, loads: list) -> None:
    """Label ``ax``'s x axis with the load ``key``; concurrency on a log2 scale ticked at the measured ``loads``;
    grid, and a legend when the axis has labelled lines."""
    ax.set_xlabel(key.replace("_", " "))
    if key == "concurrency":
        ax.set_xscale("log", base=2)
        ax.set_xticks(loads, [str(x) for x in loads])
        ax.minorticks_off()
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)


def _save(plt, fig, path: Path) -> Path:
    """Lay ``fig`` out, write it to ``path`` (PNG, 120 dpi), close it; returns ``path``."""
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _plot_latency_cdf(plt, runs: list[dict], key: str, loads: list, path: Path) -> Path:
    """``latency_cdf.png``: the TTFT, ITL, TPOT and E2E CDFs of every run, one line per mode and load (line width
    grows with the load)."""
    widths = [0.8 + 1.6 * (i + 1) / max(1, len(loads)) for i in range(len(loads))]  # thicker = higher load
    fig, axes = plt.subplots(1, 4, figsize=(19, 4.4))
    for ax, (metric, label) in zip(axes, _PANELS, strict=False):
        for r in runs:
            vals = sorted(v for v in r.get("samples_ms", {}).get(metric, []) if v is not None)
            if not vals:
                continue
            colour, style, _ = mode_style(r["mode"])
            ax.ecdf(vals, color=colour, linestyle=style, linewidth=widths[loads.index(r[key])],
                    label=f"{r['mode']} {key.replace('_', ' ')}={r[key]}")
        ax.set_xlabel(label)
        ax.set_ylabel("fraction of requests" if metric != "itl" else "fraction of chunks")
        ax.grid(alpha=0.3)
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(fontsize=7)
    fig.suptitle("Latency CDF per mode (line width: load)")
    return _save(plt, fig, path)


def _plot_latency_vs_load(plt, runs: list[dict], modes: list[str], key: str, loads: list, path: Path) -> Path:
    """``latency_vs_load.png``: per latency and mode, the mean with a one-standard-deviation error bar (clipped to
    the observed min..max) and the p99, against load."""
    fig, axes = plt.subplots(1, 4, figsize=(19, 4.4))
    for ax, (metric, label) in zip(axes, _PANELS, strict=False):
        for mode in modes:
            rs = [r for r in runs if r["mode"] == mode and r.get(f"{metric}_ms", {}).get("mean") is not None]
            if not rs:
                continue
            colour, style, marker = mode_style(mode)
            xs = [r[key] for r in rs]
            d = [r[f"{metric}_ms"] for r in rs]
            # one standard deviation each way, clipped to the observed range (a latency is never below its min)
            err = [[min(x["std"], x["mean"] - x.get("min", 0.0)) for x in d],
                   [min(x["std"], x.get("max", x["mean"] + x["std"]) - x["mean"]) for x in d]]
            ax.errorbar(xs, [x["mean"] for x in d], yerr=err, color=colour, linestyle=style, marker=marker,
                        capsize=3, label=f"{mode} mean +- std (within min..max)")
            ax.plot(xs, [r[f"{metric}_ms"]["p99"] for r in rs], color=colour, linestyle="none", marker="_",
                    markersize=12, label=f"{mode} p99")
        ax.set_ylabel(label)
        _load_axis(ax, key, loads)
    fig.suptitle("Latency against load")
    return _save(plt, fig, path)


def _plot_goodput_speedup(plt, runs: list[dict], modes: list[str], key: str, loads: list, path: Path) -> Path:
    """``goodput_speedup.png``: goodput (requests/s without SLOs) and the speedup vs ``ar`` of each mode against
    load; a request-rate axis ticks at integers when every load is one."""
    from matplotlib.ticker import MaxNLocator

    has_slo = any(r.get("goodput_rps") is not None for r in runs)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.4))
    for mode in modes:
        rs = [r for r in runs if r["mode"] == mode]
        colour, style, marker = mode_style(mode)
        a1.plot([r[key] for r in rs], [r["goodput_rps"] if has_slo else r["requests_per_s"] for r in rs],
                color=colour, linestyle=style, marker=marker, label=mode)
        sp = [(r[key], r["speedup_vs_ar"]) for r in rs if r.get("speedup_vs_ar") is not None]
        if mode != "ar" and sp:
            a2.plot(*zip(*sp, strict=False), color=colour, linestyle=style, marker=marker, label=mode)
    a1.set_ylabel("goodput (requests/s meeting all SLOs)" if has_slo else "requests/s (no SLO given)")
    a2.set_ylabel("speedup vs ar (output tokens/s; one run per point)")
    a2.axhline(1.0, color="gray", linewidth=0.8)
    for ax in (a1, a2):
        _load_axis(ax, key, loads)
        if key != "concurrency":
            ax.xaxis.set_major_locator(MaxNLocator(integer=all(float(x).is_integer() for x in loads)))
    return _save(plt, fig, path)


def plot_bench(doc: dict, folder: str | Path) -> list[Path]:
    """Write ``latency_cdf.png`` (TTFT, ITL, TPOT, E2E CDFs per mode at each load), ``latency_vs_load.png``
    (mean with a one-standard-deviation error bar, and p99, of each latency against load) and
    ``goodput_speedup.png`` (goodput, or requests/s without SLOs, and speedup vs ``ar`` against load). A mode keeps
    its colour, line style and marker (:data:`..reporting.MODE_STYLE`) in every plot; load axes tick at the
    measured loads. Returns the paths."""
    plt = pyplot()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    runs = doc["runs"]
    modes = list(dict.fromkeys(r["mode"] for r in runs))
    key = _load_key(runs[0]) if runs else "concurrency"
    loads = list(dict.fromkeys(r[key] for r in runs))
    return [_plot_latency_cdf(plt, runs, key, loads, folder / "latency_cdf.png"),
            _plot_latency_vs_load(plt, runs, modes, key, loads, folder / "latency_vs_load.png"),
            _plot_goodput_speedup(plt, runs, modes, key, loads, folder / "goodput_speedup.png")]


def export_genai_perf(doc: dict, folder: str | Path) -> list[Path]:
    """One JSON per run in the layout of genai-perf's ``profile_export_genai_perf.json`` (and AIPerf's): each
    metric an object with ``unit`` and ``avg``/``std``/``min``/``max``/``p50``/``p90``/``p95``/``p99``, plus
    ``input_config``. ``inter_token_latency`` is per streamed chunk (LR streams whole steps). Returns the paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)

    def stats(d: dict | None, unit: str) -> dict:
        d = d or {}
        return {"unit": unit, "avg": d.get("mean"),
                **{k: d.get(k) for k in ("std", "min", "max", "p50", "p90", "p95", "p99")}}

    paths = []
    for r in doc["runs"]:
        key = _load_key(r)
        out = {
            "request_throughput": {"unit": "requests/sec", "avg": r["requests_per_s"]},
            "request_goodput": {"unit": "requests/sec", "avg": r.get("goodput_rps")},
            "request_latency": stats(r["e2e_ms"], "ms"),
            "time_to_first_token": stats(r["ttft_ms"], "ms"),
            "inter_token_latency": stats(r["itl_ms"], "ms"),
            "time_per_output_token": stats(r["tpot_ms"], "ms"),
            "output_token_throughput": {"unit": "tokens/sec", "avg": r["output_tokens_per_s"]},
            "total_token_throughput": {"unit": "tokens/sec", "avg": r.get("total_tokens_per_s")},
            "output_sequence_length": stats(r.get("osl"), "tokens"),
            "input_sequence_length": stats(r.get("isl"), "tokens"),
            "input_config": {"endpoint": doc.get("endpoint", "triton-grpc"), "mode": r["mode"], key: r[key],
                             "requests": doc.get("requests_per_run"), "dataset": doc.get("dataset"),
                             "slo_ms": doc.get("slo_ms"), "command": doc.get("command")},
        }
        path = folder / f"{r['mode'].replace('+', '_')}_{'c' if key == 'concurrency' else 'rate'}{r[key]}.json"
        path.write_text(json.dumps(out, indent=2))
        paths.append(path)
    return paths


def _f(x, digits: int = 1) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def summary_table(doc: dict) -> str:
    """The markdown table of a bench report: one row per mode and load."""
    head = ("| mode | load | ISL / OSL mean | TTFT p50/p90/p99 ms | ITL p50/p99 ms | TPOT p50/p99 ms "
            "| E2E mean+-std, p50/p95/p99 ms | out tok/s | total tok/s | req/s | goodput req/s | speedup vs ar "
            "| failed |")
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in doc["runs"]:
        key = _load_key(r)
        t, i, p, e = r["ttft_ms"], r["itl_ms"], r["tpot_ms"], r["e2e_ms"]
        rows.append(
            f"| {r['mode']} | {'c' if key == 'concurrency' else 'rate'}={r[key]} "
            f"| {_f((r.get('isl') or {}).get('mean'), 0)} / {_f((r.get('osl') or {}).get('mean'), 0)} "
            f"| {_f(t['p50'])} / {_f(t['p90'])} / {_f(t['p99'])} | {_f(i['p50'])} / {_f(i['p99'])} "
            f"| {_f(p['p50'], 2)} / {_f(p['p99'], 2)} "
            f"| {_f(e.get('mean'), 0)}+-{_f(e.get('std'), 0)}, "
            f"{_f(e['p50'], 0)} / {_f(e.get('p95'), 0)} / {_f(e['p99'], 0)} "
            f"| {_f(r['output_tokens_per_s'])} | {_f(r.get('total_tokens_per_s'))} | {_f(r['requests_per_s'], 3)} "
            f"| {_f(r['goodput_rps'], 3)} "
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
        f"- endpoint: {doc.get('endpoint', 'triton-grpc')}; dataset: {doc.get('dataset', 'n/a')}; "
        f"{doc.get('requests_per_run', '?')} requests per mode and load",
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
