"""Medusa heads: token proposals from the target's own last hidden state, with no extra forward.

Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration Framework with Multiple Decoding Heads", section
2.1.1: head ``i`` (0-based) reads the target's last hidden state ``h_t`` at position ``t`` (the one whose
language-model head predicts token ``t+1``) and predicts token ``t+2+i``::

    p_t^(i) = softmax(W2_i (SiLU(W1_i h_t + b1_i) + h_t))

``W1`` starts at zero and ``W2`` at the target's language-model head, so an untrained head predicts what the
base head does. This module proposes the top-1 chain (each head's argmax); the proposals are deterministic, so
verification (:func:`.spec_decode.verify`) treats them as one-hot draft distributions and sampled output keeps
the target distribution. Medusa's "typical acceptance" is NOT used: it accepts tokens the target would not
have sampled and so changes the distribution (Medusa paper, section 2.3.1).

Checkpoint layout: the one FasterDecoding/Medusa writes and TensorRT-LLM's Medusa conversion reads
(``examples/medusa/convert_checkpoint.py --medusa_model_dir DIR --num_medusa_heads K --num_medusa_layers L``,
``tensorrt_llm/models/medusa/weight.py::load_medusa_hf``): ``DIR/medusa_lm_head.safetensors`` with
``{head}.{layer}.linear.weight`` / ``.bias`` for each residual block and ``{head}.{L}.weight`` for the head's
vocabulary projection, and ``DIR/config.json`` with ``medusa_num_heads`` and ``medusa_num_layers``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from .spec_decode import Proposal, ProposalRow

WEIGHTS = "medusa_lm_head.safetensors"


class ResBlock(nn.Module):
    """``x + SiLU(Linear(x))`` (Medusa's residual block; the linear starts at zero, so the block starts as the
    identity)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """``num_heads`` Medusa heads of ``num_layers`` residual blocks and a vocabulary projection each.

    Args:
        hidden_size, vocab_size: the target's.
        num_heads: proposals per step at most (head ``i`` predicts ``i + 2`` tokens past the hidden state's
            position).
        num_layers: residual blocks per head (Medusa's default 1).
        lm_head: the target's ``[vocab, hidden]`` output weight to start each projection from (None: random).
    """

    def __init__(self, hidden_size: int, vocab_size: int, num_heads: int, num_layers: int = 1,
                 lm_head: torch.Tensor | None = None) -> None:
        super().__init__()
        if num_heads < 1 or num_layers < 0:
            raise ValueError("num_heads must be >= 1 and num_layers >= 0")
        self.hidden_size, self.vocab_size = hidden_size, vocab_size
        self.num_heads, self.num_layers = num_heads, num_layers
        # nn.Sequential children are named 0..L, so the state dict keys are TensorRT-LLM's "{h}.{l}.linear.*"
        # and "{h}.{L}.weight" (the module list itself is the top level).
        self.heads = nn.ModuleList(
            nn.Sequential(*[ResBlock(hidden_size) for _ in range(num_layers)],
                          nn.Linear(hidden_size, vocab_size, bias=False))
            for _ in range(num_heads))
        if lm_head is not None:
            with torch.no_grad():
                for h in self.heads:
                    h[-1].weight.copy_(lm_head)

    def forward(self, hidden: torch.Tensor, k: int | None = None) -> torch.Tensor:
        """``[..., hidden]`` -> ``[k, ..., vocab]`` logits of the first ``k`` heads (default all; head ``i`` first)."""
        return torch.stack([h(hidden) for h in self.heads[:k]])

    def state_dict_trtllm(self) -> dict[str, torch.Tensor]:
        """The weights under TensorRT-LLM's / FasterDecoding's key names (see the module docstring)."""
        return {k.removeprefix("heads."): v.detach().contiguous() for k, v in self.state_dict().items()}

    def save_pretrained(self, folder: str | Path, base_model: str = "") -> Path:
        """Write ``medusa_lm_head.safetensors`` and ``config.json`` into ``folder``; returns the folder."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        save_file(self.state_dict_trtllm(), str(folder / WEIGHTS))
        config = {"medusa_num_heads": self.num_heads, "medusa_num_layers": self.num_layers,
                  "hidden_size": self.hidden_size, "vocab_size": self.vocab_size,
                  "base_model_name_or_path": base_model}
        (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        return folder

    @classmethod
    def from_pretrained(cls, folder: str | Path) -> MedusaHeads:
        """Load heads written by :meth:`save_pretrained` (or by FasterDecoding/Medusa's trainer).

        Raises:
            ValueError: a missing or inconsistent file (the message names it).
        """
        folder = Path(folder)
        try:
            config = json.loads((folder / "config.json").read_text())
            weights = load_file(str(folder / WEIGHTS))
        except (OSError, json.JSONDecodeError, SafetensorError) as exc:
            raise ValueError(f"medusa: cannot read Medusa heads in {folder}: {exc}") from None
        try:
            n, layers = int(config["medusa_num_heads"]), int(config.get("medusa_num_layers", 1))
            vocab, hidden = weights[f"0.{layers}.weight"].shape
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"medusa: {folder} is not a Medusa checkpoint (missing {exc})") from None
        heads = cls(hidden, vocab, n, layers)
        try:
            missing, unexpected = heads.load_state_dict({f"heads.{k}": v for k, v in weights.items()}, strict=False)
        except RuntimeError as exc:  # a tensor of the wrong shape
            raise ValueError(f"medusa: {folder}/{WEIGHTS} does not match its config.json ({exc})") from None
        if missing or unexpected:
            raise ValueError(f"medusa: {folder}/{WEIGHTS} does not match its config.json "
                             f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
        return heads.eval()


class MedusaProposer:
    """``method: medusa``: each row's proposals are the heads' argmaxes on the hidden state the target's last
    forward produced at the row's last committed token (the last row of ``ProposalRow.features``: from its
    prefill for its first decoding step, then from each verification forward). All rows' heads run in one
    batched call."""

    method = "medusa"

    def __init__(self, heads: MedusaHeads) -> None:
        self.heads = heads

    @torch.inference_mode()
    def propose(self, rows: Sequence[ProposalRow]) -> list[Proposal]:
        out = [Proposal([]) for _ in rows]
        have = [i for i, r in enumerate(rows) if r.features is not None and len(r.features)]
        if not have:
            return out
        k = max(rows[i].k for i in have)
        hidden = torch.stack([rows[i].features[-1] for i in have])
        best = self.heads(hidden, k).argmax(-1).T.tolist()  # [n, k]
        for j, i in enumerate(have):
            out[i] = Proposal(best[j][: rows[i].k])
        return out
