"""The peer benchmark: Lookahead Reasoning on llama.cpp against llama.cpp itself, on the demo target, in ONE run.

Rows (each in its own worker process, so no two engines share an OpenMP runtime; only one computes at a time):

* ``llama.cpp plain, T threads``: llama-cpp-python's ``Llama.generate`` on the demo target as GGUF (the profile's
  ``engines/demo/gguf/target-f32.gguf``), at each ``--peer-threads`` count: the peer gets the sum of our roles'
  threads (``demo-llamacpp``: 1 + 1 + 1) and, where it decodes faster with fewer, that count too; the speedups are
  against the fastest of these rows.
* ``llama-server <spec>``: llama.cpp's own OpenAI-style server, built from the llama.cpp llama-cpp-python vendors
  (``benchmarks/build_llamacpp_tools.sh``), with each speculative configuration of ``--server-specs`` (its
  draft-model mode with the demo draft as GGUF, its n-gram modes, chains); prompts go to ``/completion`` as token
  ids (the GGUF's pre-tokenizer is not the trio's: ``build_scripts/export_gguf.py``), prompt caching off.
* ours: the ``demo`` profile (portable engine) in ``ar`` and ``lr+sd``, and ``demo-llamacpp`` in ``ar``, ``sd``,
  ``lr``, ``lr+sd`` and ``lr+sd`` with adaptive gamma, each with its profile's own defaults.

Protocol: one untimed warm-up request per row on a spare problem, then every problem through every row in a rotated
order (problem ``i`` starts at row ``i mod rows``), engines' prefix caches emptied before each timed request; tokens/s
is total tokens over total seconds (each request timed from submission to its last token, prefill included); 95%
paired bootstrap intervals over problems; answers graded in the same run; 1-minute load average at start and end.

Usage:
  benchmarks/build_llamacpp_tools.sh          # once: llama-server (about 5 minutes)
  python benchmarks/llamacpp_peer.py --problems 200 [--temperature 0.6 --seed 7] [--out FILE]

Prints a markdown table and writes the JSON report (default ``benchmarks/out/llamacpp_peer.json``).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TOOLS = ROOT / "benchmarks" / "out" / "llamacpp"
#: llama-server speculative configurations (name -> extra arguments; DRAFT stands for the draft GGUF).
SERVER_SPECS = {
    "plain": [],
    "draft-simple k4": ["--spec-type", "draft-simple", "-md", "DRAFT", "--spec-draft-n-max", "4", "-td", "1"],
    "draft-simple k8": ["--spec-type", "draft-simple", "-md", "DRAFT", "--spec-draft-n-max", "8", "-td", "1"],
    "ngram-mod": ["--spec-type", "ngram-mod"],
    "ngram-simple": ["--spec-type", "ngram-simple"],
    "ngram-mod,draft-simple k4": ["--spec-type", "ngram-mod,draft-simple", "-md", "DRAFT", "--spec-draft-n-max", "4",
                                  "-td", "1"],
}
OURS = {
    "portable ar": ("demo", "ar", {}),
    "portable lr+sd": ("demo", "lr+sd", {}),
    "llamacpp ar": ("demo-llamacpp", "ar", {}),
    "llamacpp sd": ("demo-llamacpp", "sd", {}),
    "llamacpp lr": ("demo-llamacpp", "lr", {}),
    "llamacpp lr+sd": ("demo-llamacpp", "lr+sd", {}),
    "llamacpp lr+sd adaptive": ("demo-llamacpp", "lr+sd", {"adaptive_gamma": True}),
    "portable lr+sd, branches unpredicted": ("demo", "lr+sd", {"predict_branches": False}),
    "llamacpp lr, branches unpredicted": ("demo-llamacpp", "lr", {"predict_branches": False}),
    "llamacpp lr+sd, branches unpredicted": ("demo-llamacpp", "lr+sd", {"predict_branches": False}),
}


# -- the worker side ---------------------------------------------------------------------------------------
def _items(args):
    from lookahead_reasoning.evaluation.runner import load_with_spare

    items, spare = load_with_spare(args.dataset, args.problems)
    return items, spare or items[0]


def _sampling(args, profile) -> dict:
    s = profile.options.sampling.model_dump()
    if args.temperature is not None:
        s["temperature"] = args.temperature
    if args.seed is not None:
        s["seed"] = args.seed
    return s


class Ours:
    """A Lookahead Reasoning mode of one of our profiles."""

    def __init__(self, name: str, args) -> None:
        from lookahead_reasoning.core.lookahead import with_overrides
        from lookahead_reasoning.profiles import build_reasoner_for, load_profile

        prof_name, mode, extra = OURS[name]
        self.profile = load_profile(prof_name)
        self.opts = with_overrides(self.profile.options, mode=mode, sampling=_sampling(args, self.profile), **extra)
        self.r = build_reasoner_for(self.profile, self.opts, [mode])
        roles = {"target": self.profile.target, "draft": self.profile.draft, "judge": self.profile.judge}
        used = {"target"} | ({"draft"} if self.r.draft is not None else set()) | (
            {"judge"} if self.r.judge_engine is not None else set())
        self.threads = {k: v.num_threads for k, v in roles.items() if k in used and v is not None}

    def run(self, item) -> dict:
        for e in {id(x): x for x in (self.r.target, self.r.draft, self.r.judge_engine) if x is not None}.values():
            getattr(e, "reset_prefix_cache", lambda: None)()
        res = self.r.run(None, [{"role": "user", "content": item.prompt}], self.opts)
        m = res.metrics
        return {"text": res.text, "tokens": m.generated_tokens, "seconds": m.seconds,
                "accepted_steps": m.accepted_steps, "verified_steps": m.verified_steps, "cycles": m.cycles,
                "steps": m.steps, "judge_seconds": m.judge_seconds, "draft_seconds": m.draft.seconds,
                "target_seconds": m.target.seconds}


@functools.lru_cache(maxsize=1)
def _tokenizer():
    from lookahead_reasoning.profiles import PROFILES
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(PROFILES["demo-llamacpp"].target.tokenizer_path())


def _prompt_ids(item) -> list[int]:
    tok = _tokenizer()  # loaded once per worker, not per problem
    ids = tok.apply_chat_template([{"role": "user", "content": item.prompt}], add_generation_prompt=True,
                                  tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


class LlamaCppPlain:
    """llama-cpp-python's own generation loop (``Llama.generate``) on the target GGUF."""

    def __init__(self, threads: int, args) -> None:
        from llama_cpp import Llama
        from lookahead_reasoning.profiles import PROFILES

        prof = PROFILES["demo-llamacpp"]
        self.llm = Llama(str(prof.target.located_path()), n_ctx=2048, n_threads=threads, n_threads_batch=threads,
                         verbose=False)
        self.s = _sampling(args, prof)
        self.max_tokens = prof.options.token_budget
        self.threads = {"target": threads}

    def run(self, item) -> dict:
        ids = _prompt_ids(item)
        s, llm = self.s, self.llm
        greedy = not s["temperature"]
        if not greedy and s.get("seed") is not None:
            llm.set_seed(int(s["seed"]))
        llm.reset()
        out = []
        t0 = time.perf_counter()
        for tok in llm.generate(ids, temp=s["temperature"] or 0.0, top_k=1 if greedy else (s.get("top_k") or 0),
                                top_p=1.0 if greedy else s.get("top_p") or 1.0, repeat_penalty=1.0):
            out.append(int(tok))
            if tok == llm.token_eos() or len(out) >= self.max_tokens:
                break
        dt = time.perf_counter() - t0
        return {"text": llm.detokenize(out).decode(errors="replace"), "tokens": len(out), "seconds": dt}


class LlamaServer:
    """llama-server on the target GGUF with one speculative configuration, on 127.0.0.1."""

    def __init__(self, spec: str, threads: int, args) -> None:
        from lookahead_reasoning.profiles import PROFILES

        prof = PROFILES["demo-llamacpp"]
        sock = __import__("socket").socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        sock.close()
        extra = [str(prof.draft.located_path()) if a == "DRAFT" else a for a in SERVER_SPECS[spec]]
        cmd = [str(Path(args.tools) / "llama-server"), "-m", str(prof.target.located_path()), "--host", "127.0.0.1",
               "--port", str(self.port), "-t", str(threads), "-tb", str(threads), "-c", "4096", "-np", "1",
               "-fa", "off", "--no-webui", *extra]
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        while True:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"llama-server {spec!r} exited: {self.log.read()[-1500:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.time() > deadline:
                raise RuntimeError(f"llama-server {spec!r} not ready in 120 s")
            time.sleep(0.3)
        self.s = _sampling(args, prof)
        self.max_tokens = prof.options.token_budget
        self.threads = {"target": threads} | ({"draft": 1} if "DRAFT" in SERVER_SPECS[spec] else {})
        self.cmd = cmd

    def run(self, item) -> dict:
        s = self.s
        greedy = not s["temperature"]
        body = {"prompt": _prompt_ids(item), "n_predict": self.max_tokens, "cache_prompt": False,
                "temperature": s["temperature"] or 0.0, "top_k": 1 if greedy else (s.get("top_k") or 0),
                "top_p": 1.0 if greedy else (s.get("top_p") or 1.0), "repeat_penalty": 1.0}
        if s.get("seed") is not None:
            body["seed"] = int(s["seed"])
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/completion", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        t0 = time.perf_counter()
        with urllib.request.urlopen(req, timeout=300) as r:
            doc = json.loads(r.read())
        dt = time.perf_counter() - t0
        t = doc.get("timings", {})
        return {"text": doc["content"], "tokens": int(doc["tokens_predicted"]), "seconds": dt,
                "draft_n": t.get("draft_n"), "draft_n_accepted": t.get("draft_n_accepted")}

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _make(row: str, args):
    kind, _, rest = row.partition(":")
    if kind == "plain":
        return LlamaCppPlain(int(rest), args)
    if kind == "server":
        spec, _, t = rest.rpartition("@")
        return LlamaServer(spec, int(t), args)
    return Ours(rest, args)


def _worker(args) -> int:
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    items, spare = _items(args)
    c = _make(args.worker, args)
    c.run(spare)  # the untimed warm-up
    proto.write(json.dumps({"ready": {"threads": c.threads, "cmd": getattr(c, "cmd", None)}}) + "\n")
    for line in sys.stdin:
        msg = json.loads(line)
        if msg.get("quit"):
            break
        proto.write(json.dumps(c.run(items[msg["item"]])) + "\n")
    getattr(c, "close", lambda: None)()
    return 0


# -- the parent side ----------------------------------------------------------------------------------------
class Worker:
    def __init__(self, row: str, argv: list[str]) -> None:
        self.row = row
        self.err = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *argv, "--worker", row],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err, text=True,
                                     bufsize=1)
        self.info = None

    def read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.err.seek(0)
            raise RuntimeError(f"worker {self.row!r} died: {self.err.read()[-2000:]}")
        return json.loads(line)

    def ask(self, i: int) -> dict:
        self.proc.stdin.write(json.dumps({"item": i}) + "\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write('{"quit": true}\n')
                self.proc.stdin.flush()
                self.proc.wait(timeout=60)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()


def _label(row: str) -> str:
    kind, _, rest = row.partition(":")
    if kind == "plain":
        return f"llama.cpp plain ({rest} thread{'s' * (rest != '1')})"
    if kind == "server":
        spec, _, t = rest.rpartition("@")
        return f"llama-server {spec} ({t} thread{'s' * (t != '1')})"
    return f"ours: {rest}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problems", type=int, default=200)
    ap.add_argument("--dataset", default="synthetic")
    ap.add_argument("--temperature", type=float, default=None)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--peer-threads", default="1,3", help="llama.cpp plain rows' threads (default 1,3)")
    ap.add_argument("--server-specs", default=";".join(SERVER_SPECS),
                    help="llama-server configurations (names of SERVER_SPECS, ';'-separated) at --server-threads")
    ap.add_argument("--server-threads", type=int, default=1)
    ap.add_argument("--ours", default=";".join(OURS), help="our rows (names of OURS, ';'-separated)")
    ap.add_argument("--tools", default=None, help="folder with llama-server (default: build_llamacpp_tools.sh's)")
    ap.add_argument("--out", default="benchmarks/out/llamacpp_peer.json")
    ap.add_argument("--render", default=None, help="print the tables of a saved JSON report and exit")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return _worker(args)
    if args.render:
        print(render(json.loads(Path(args.render).read_text())))
        return 0

    import numpy as np
    from lookahead_reasoning.evaluation.answers import check_answer
    from lookahead_reasoning.evaluation.runner import bootstrap_speedup_ci, load_average, measurement_block

    load_start = load_average()
    if args.tools is None:
        found = sorted(DEFAULT_TOOLS.glob("build-*/bin/llama-server"))
        args.tools = str(found[-1].parent) if found else ""
    rows = [f"plain:{t}" for t in args.peer_threads.split(",") if t]
    specs = [s for s in args.server_specs.split(";") if s] if args.tools else []
    if not args.tools:
        print("no llama-server: run benchmarks/build_llamacpp_tools.sh; the llama-server rows are skipped",
              file=sys.stderr)
    rows += [f"server:{s}@{args.server_threads}" for s in specs]
    rows += [f"ours:{o}" for o in args.ours.split(";") if o]
    common = ["--problems", str(args.problems), "--dataset", args.dataset, "--tools", args.tools]
    common += ["--temperature", str(args.temperature)] if args.temperature is not None else []
    common += ["--seed", str(args.seed)] if args.seed is not None else []
    items, _ = _items(args)
    workers = {}
    try:
        for row in rows:  # one at a time: each warms up alone
            w = Worker(row, common)
            w.info = w.read()["ready"]
            workers[row] = w
            print(f"ready: {_label(row)} {w.info['threads']}", file=sys.stderr)
        results = {row: [] for row in rows}
        t_start = time.time()
        for i in range(len(items)):
            k = i % len(rows)
            for row in rows[k:] + rows[:k]:
                results[row].append(workers[row].ask(i))
            if (i + 1) % 10 == 0:
                print(f"  {i + 1}/{len(items)} problems, {time.time() - t_start:.0f} s, load {load_average()}",
                      file=sys.stderr)
    finally:
        for w in workers.values():
            w.close()

    from lookahead_reasoning.profiles import PROFILES

    parser = PROFILES["demo"].reasoning_parser
    summary = {}
    for row, res in results.items():
        tok = np.array([r["tokens"] for r in res], float)
        sec = np.array([r["seconds"] for r in res], float)
        graded = [check_answer(items[i], r["text"], parser) for i, r in enumerate(res)]
        acc = [bool(g) for g in graded if g is not None]
        d = {"label": _label(row), "threads": workers[row].info["threads"], "tokens": int(tok.sum()),
             "seconds": float(sec.sum()), "tokens_per_s": float(tok.sum() / sec.sum()),
             "accuracy": sum(acc) / len(acc) if acc else None, "graded": len(acc), "correct": sum(acc),
             "per_item": [(float(a), float(b)) for a, b in zip(tok, sec, strict=False)], "correct_by_item": graded}
        if "accepted_steps" in res[0]:
            ver = sum(r["verified_steps"] for r in res)
            d["acceptance"] = sum(r["accepted_steps"] for r in res) / ver if ver else None
            for k in ("cycles", "steps", "judge_seconds", "draft_seconds", "target_seconds"):
                d[k] = float(sum(r[k] for r in res))
        if res[0].get("draft_n") is not None:
            dn = sum(r.get("draft_n") or 0 for r in res)
            d["draft_acceptance"] = sum(r.get("draft_n_accepted") or 0 for r in res) / dn if dn else None
        if workers[row].info.get("cmd"):
            d["command"] = " ".join(workers[row].info["cmd"])
        summary[row] = d
    plain = [r for r in rows if r.startswith("plain:")]
    ref = max(plain, key=lambda r: summary[r]["tokens_per_s"])
    server = [r for r in rows if r.startswith("server:") and not r.startswith("server:plain@")]
    best_spec = max(server, key=lambda r: summary[r]["tokens_per_s"]) if server else None
    for _row, d in summary.items():
        for name, base in (("vs_llamacpp_plain", ref), ("vs_peer_best_spec", best_spec)):
            if base is None:
                continue
            b = summary[base]
            d[name] = d["tokens_per_s"] / b["tokens_per_s"]
            d[name + "_ci95"] = bootstrap_speedup_ci(*zip(*d["per_item"], strict=False),
                                                     *zip(*b["per_item"], strict=False))
    report = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": "python benchmarks/llamacpp_peer.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "cpu": next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                     if ln.startswith("model name")), "unknown"),
        "problems": len(items), "dataset": args.dataset, "temperature": args.temperature, "seed": args.seed,
        "reference_row": ref, "peer_best_spec_row": best_spec,
        "measurement": measurement_block(load_start, warmup_requests_per_row=1,
                                         order="rotated per problem, one worker process per row"),
        "rows": summary,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(render(report))
    return 0


def render(report: dict) -> str:
    """The markdown table of a report."""
    lines = [f"date {report['date']}; {report['cpu']}; {report['problems']} problems ({report['dataset']}); "
             f"temperature {report['temperature'] or 'greedy'}; load {report['measurement']['load_avg_1min_start']}"
             f" -> {report['measurement']['load_avg_1min_end']}", "",
             "| row | threads per role | tok/s | vs llama.cpp plain [95%] | vs peer's best SD [95%] | accuracy | "
             "step acceptance |", "|---|---|---:|---|---|---:|---:|"]

    def ratio(d, k):
        if k not in d:
            return "-"
        ci = d.get(k + "_ci95") or [float("nan")] * 2
        return f"{d[k]:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]"

    for d in report["rows"].values():
        acc = f"{100 * d['accuracy']:.1f}%" if d["accuracy"] is not None else "-"
        acc_s = f"{d['acceptance']:.2f}" if d.get("acceptance") is not None else (
            f"({d['draft_acceptance']:.2f} of draft tokens)" if d.get("draft_acceptance") is not None else "-")
        th = " + ".join(f"{k} {v}" for k, v in d["threads"].items())
        lines.append(f"| {d['label']} | {th} | {d['tokens_per_s']:.0f} | {ratio(d, 'vs_llamacpp_plain')} | "
                     f"{ratio(d, 'vs_peer_best_spec')} | {acc} | {acc_s} |")
    lines += ["", *cycle_profile(report)]
    return "\n".join(lines)


def cycle_profile(report: dict) -> list[str]:
    """Per cycle of each of our speculative rows, where the time goes, in units of one ``ar`` step of the same
    profile in the same run (``ar`` seconds / ``ar`` steps): draft, target call(s), judge, and the rest (the loop's
    Python, thread hand-offs, text handling)."""
    rows = report["rows"]
    out = ["| our row | steps per cycle | cycle in ar steps | draft | target call | judge | rest (Python, hand-offs) |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for key, d in rows.items():
        if not d.get("cycles") or key.endswith(" ar") or " lr" not in key:
            continue
        prof = "portable" if "portable" in key else "llamacpp"
        ar = rows.get(f"ours:{prof} ar")
        if not ar or not ar.get("steps"):
            continue
        unit = ar["seconds"] / ar["steps"]
        c = d["cycles"]
        parts = [d["draft_seconds"], d["target_seconds"], d["judge_seconds"]]
        rest = d["seconds"] - sum(parts)
        cells = [f"{x / c / unit:.2f}" for x in (d["seconds"], *parts, rest)]
        out.append(f"| {d['label']} | {d['steps'] / c:.2f} | " + " | ".join(cells) + " |")
    return out if len(out) > 2 else []


if __name__ == "__main__":
    sys.exit(main())
