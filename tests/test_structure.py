"""Arrows one way: the engine layer (``orchestrator/backends``) never imports the serving layer."""

from __future__ import annotations

import ast
from pathlib import Path

BACKENDS = Path(__file__).resolve().parents[1] / "orchestrator" / "backends"


def _imports(path: Path) -> set[str]:
    """Module names ``path`` imports, relative ones resolved against ``lookahead_reasoning.backends``."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ["lookahead_reasoning", "backends"][: max(0, 2 - (node.level - 1))] if node.level else []
            out.add(".".join(base + ([node.module] if node.module else [])))
    return out


def test_backends_do_not_import_serving():
    offenders = {p.name: sorted(m for m in _imports(p) if m.startswith("lookahead_reasoning.serving"))
                 for p in BACKENDS.glob("*.py")}
    assert not {k: v for k, v in offenders.items() if v}
    # the check resolves relative imports: a known relative import is seen
    assert "lookahead_reasoning.backends.role_tensors" in _imports(BACKENDS / "triton_bls.py")
