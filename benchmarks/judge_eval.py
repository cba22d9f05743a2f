"""Judge checkpoints side by side: precision / recall per step kind on the held-out synthetic pairs.

The pairs are the ones ``build_scripts/train_demo_models.py`` evaluates on
(``generate_step_pairs(4000, JUDGE_EVAL_SEED)``, never used for training); the verdict is the script's own
``judge_verdicts`` (the greedy token after the pre-filled ``[`` is ``aligned``) and the metrics its
``binary_metrics``, so figures equal the model card's ``judge_synthetic_by_kind`` for the same checkpoint and pair
generator. Use it to compare a retrained judge with the shipped one without re-running the whole evaluation.

Usage: python benchmarks/judge_eval.py engines/demo/judge /path/to/other/judge [--pairs 4000] [--out FILE]

Output: a table (kind, n, then precision / recall per checkpoint) on stdout; with ``--out``, JSON
``{checkpoint: {kind: binary_metrics}}`` (kind ``all`` included).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "build_scripts"))
import train_demo_models as tdm  # noqa: E402
from lookahead_reasoning.evaluation import synthetic as syn  # noqa: E402


def per_kind(path: Path, n_pairs: int) -> dict:
    """``{kind: binary_metrics}`` of the judge at ``path`` (kind ``all``: every pair)."""
    judge, tok = tdm.load_checkpoint(path, "cpu")
    pairs = syn.generate_step_pairs(n_pairs, syn.JUDGE_EVAL_SEED, style=tdm.tokenizer_style(tok))
    with torch.no_grad():
        pred = tdm.judge_verdicts(judge, tok, [(a, b) for a, b, _ in pairs])
    out = tdm.metrics_by_kind(pred, pairs)
    out["all"] = tdm.binary_metrics(pred, [y for *_, y in pairs])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("judges", nargs="+", type=Path, help="judge checkpoint folders")
    ap.add_argument("--pairs", type=int, default=4000)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    res = {str(p): per_kind(p, args.pairs) for p in args.judges}
    kinds = list(next(iter(res.values())))
    print("| kind | n | " + " | ".join(f"{p}: precision / recall" for p in res) + " |")
    print("|---|---|" + "---|" * len(res))
    for k in kinds:
        cells = [f"{r[k]['precision']:.3f} / {r[k]['recall']:.3f}" for r in res.values()]
        print(f"| {k} | {next(iter(res.values()))[k]['n']} | " + " | ".join(cells) + " |")
    if args.out:
        args.out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
