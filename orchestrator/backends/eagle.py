"""EAGLE-3 drafting: one small decoder layer over the target's own features proposes tokens autoregressively.

Li et al. 2025, "EAGLE-3: Scaling up Inference Acceleration of Large Language Models via Training-Time Test"
(section 3): the target's hidden states from a low, a middle and a high layer are concatenated (``3H``) and fused
by ``fc`` into one ``H`` feature per position; the draft layer reads, at each position, that feature together with
the embedding of the NEXT token (``2H`` into its attention) and predicts the token after it directly (no feature
regression, unlike EAGLE-1). For its second and later proposals the draft feeds back its own output (the
pre-norm hidden state) in place of the target's feature; "training-time test" trains it on exactly that.

This module implements EAGLE-3 (not EAGLE-1/2): the top-1 chain (no draft tree), proposals deterministic, so
verification (:func:`.spec_decode.verify`) treats them as one-hot draft distributions and sampled output keeps the
target distribution. The draft layer attends to the features of the row's last ``attention_window`` committed
positions (the engine keeps that window per row, :mod:`.portable`), recomputed at each decoding step rather than
kept in a KV cache of its own: on this project's small targets that costs less than the cache's bookkeeping.

Feature layers: ``aux_layers`` are indices into transformers' ``output_hidden_states`` (index ``i`` = the input
of decoder layer ``i``), default ``(2, L // 2, L - 3)``, which are the layers vLLM captures for EAGLE-3 (the input
of those layers) and TensorRT-LLM's default ``eagle3_layers_to_capture`` ``{1, L // 2 - 1, L - 4}`` (their outputs).

Checkpoint layout: the one SafeAILab/EAGLE's EAGLE-3 trainer writes and vLLM (``llama_eagle3.py``) and
TensorRT-LLM (``Eagle3DecodingConfig(speculative_model_dir=...)``) read: ``model.safetensors`` with ``fc.weight``
``[H, 3H]``, ``midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}.weight``,
``midlayer.self_attn.{q,k,v,o}_proj.weight`` (q/k/v read ``2H``), ``midlayer.mlp.{gate,up,down}_proj.weight``,
``norm.weight``, ``lm_head.weight`` ``[draft_vocab, H]``, ``d2t`` (int64, draft id -> target id offset) and
``t2d`` (bool over the target vocabulary); no ``embed_tokens`` (both readers then share the target's); a Llama
``config.json`` with ``architectures: ["LlamaForCausalLMEagle3"]``, ``num_hidden_layers: 1``,
``draft_vocab_size`` and the top-level ``eagle_aux_hidden_state_layer_ids`` vLLM reads
(``get_eagle3_aux_layers_from_config``; layer inputs, as ``aux_layers`` here). A checkpoint without that key gets
vLLM's default for the target (:func:`default_aux_layers`), as in vLLM.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import (
    LlamaMLP,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

from .spec_decode import Proposal, ProposalRow

WEIGHTS = "model.safetensors"
DEFAULT_WINDOW = 32


def _rope_theta(config) -> float:
    """RoPE base of a config (transformers 5 ``rope_parameters``, 4.x ``rope_theta``)."""
    return float((getattr(config, "rope_parameters", None) or {}).get("rope_theta")
                 or getattr(config, "rope_theta", None) or 10000.0)


def default_aux_layers(num_layers: int) -> tuple[int, int, int]:
    """vLLM's EAGLE-3 feature layers for a target of ``num_layers`` decoder layers, as ``output_hidden_states``
    indices: the inputs of layers ``2``, ``L // 2`` and ``L - 3``."""
    return (2, num_layers // 2, num_layers - 3)


class Eagle3Layer(nn.Module):
    """EAGLE-3's draft decoder layer (``midlayer``): Llama attention whose q/k/v read ``[embedding ; feature]``
    (``2H``, each half RMS-normed), then Llama's MLP, with the feature as the residual."""

    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        h, hd = c.hidden_size, c.head_dim
        self.heads, self.kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, hd
        self.input_layernorm = LlamaRMSNorm(h, eps=c.rms_norm_eps)
        self.hidden_norm = LlamaRMSNorm(h, eps=c.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(h, eps=c.rms_norm_eps)
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(2 * h, self.heads * hd, bias=False)
        self.self_attn.k_proj = nn.Linear(2 * h, self.kv_heads * hd, bias=False)
        self.self_attn.v_proj = nn.Linear(2 * h, self.kv_heads * hd, bias=False)
        self.self_attn.o_proj = nn.Linear(self.heads * hd, h, bias=False)
        self.mlp = LlamaMLP(c)


class Eagle3Head(nn.Module):
    """An EAGLE-3 draft head for one target.

    Args:
        config: a Llama config for the head: ``hidden_size`` (= the target's ``H``), attention shape,
            ``intermediate_size``, ``vocab_size`` (the target's), ``draft_vocab_size``, ``rms_norm_eps``,
            ``rope_parameters``; attributes ``aux_layers`` (three ``output_hidden_states`` indices) and
            ``attention_window`` (positions of context the layer attends to).
        embed_tokens: the target's ``[vocab, H]`` input embedding (shared, not trained, not saved).
        lm_head: the target's ``[vocab, H]`` output weight to start ``lm_head`` from (None: random).
    """

    def __init__(self, config: LlamaConfig, embed_tokens: torch.Tensor, lm_head: torch.Tensor | None = None) -> None:
        super().__init__()
        h = config.hidden_size
        self.config = config
        self.aux_layers = tuple(int(i) for i in config.aux_layers)
        self.attention_window = int(config.attention_window)
        self.fc = nn.Linear(3 * h, h, bias=False)
        self.midlayer = Eagle3Layer(config)
        self.norm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(h, config.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(config.vocab_size, dtype=torch.bool))
        self.embed = nn.Embedding.from_pretrained(embed_tokens.detach(), freeze=True)  # shared, not copied
        self.rotary = LlamaRotaryEmbedding(config)
        if lm_head is not None:
            with torch.no_grad():
                self.lm_head.weight.copy_(lm_head[: config.draft_vocab_size])

    # -- the layer in pieces: projections of a span of positions, then the rest of one position ------------
    def qkv(self, hidden: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``hidden [B, S, H]`` features (fused target features or the draft's own pre-norm outputs), ``tokens
        [B, S]`` int64 (the token after each feature's position), ``positions [B, S]`` int64 ->
        ``q [B, heads, S, hd]``, ``k, v [B, kv_heads, S, hd]`` (RoPE applied)."""
        m = self.midlayer
        x = torch.cat([m.input_layernorm(self.embed(tokens)), m.hidden_norm(hidden)], dim=-1)
        b, s, _ = x.shape
        q = m.self_attn.q_proj(x).view(b, s, m.heads, m.head_dim).transpose(1, 2)
        k = m.self_attn.k_proj(x).view(b, s, m.kv_heads, m.head_dim).transpose(1, 2)
        v = m.self_attn.v_proj(x).view(b, s, m.kv_heads, m.head_dim).transpose(1, 2)
        cos, sin = self.rotary(x, positions)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        return q, k, v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Scaled dot-product attention, ``mask [B, 1, Sq, Sk]`` bool (True = attend) -> ``[B, Sq, heads * hd]``
        (grouped-query: each key/value head serves ``heads / kv_heads`` query heads)."""
        groups = q.shape[1] // k.shape[1]
        if groups > 1:
            k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
        out = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return out.transpose(1, 2).flatten(2)

    def finish(self, attn: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer after attention: ``attn [B, S, heads * hd]``, ``hidden [B, S, H]`` (the residual) ->
        ``(logits [B, S, draft_vocab], pre-norm output [B, S, H])`` (vLLM ``llama_eagle3.py``: residual add,
        post-attention norm, MLP, residual add, final norm)."""
        m = self.midlayer
        residual = hidden + m.self_attn.o_proj(attn)
        out = residual + m.mlp(m.post_attention_layernorm(residual))
        return self.lm_head(self.norm(out)), out

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids -> target ids (``id + d2t[id]``)."""
        return draft_ids + self.d2t[draft_ids]

    @torch.inference_mode()
    def propose(self, features: Sequence[torch.Tensor], tokens: Sequence[Sequence[int]], k: int) -> list[list[int]]:
        """The top-1 chain of ``k`` tokens for each row, all rows batched.

        Args:
            features: per row ``[n_r, 3H]`` target features at its last ``n_r`` positions (``n_r >= 1``; the last
                one is the position whose output predicted the row's last committed token).
            tokens: per row its last ``n_r`` committed tokens (the token after each feature's position).
            k: proposals per row.

        Returns:
            ``k`` target token ids per row.
        """
        rows, n = len(features), max(f.shape[0] for f in features)
        dev, dt = self.fc.weight.device, self.fc.weight.dtype
        feats = torch.zeros((rows, n, features[0].shape[1]), dtype=dt, device=dev)
        toks = torch.zeros((rows, n), dtype=torch.long, device=dev)
        real = torch.zeros((rows, n), dtype=torch.bool, device=dev)
        # right-aligned: every row's last position is n - 1
        for r, (f, t) in enumerate(zip(features, tokens, strict=False)):
            feats[r, n - f.shape[0]:] = f.to(dt)
            toks[r, n - f.shape[0]:] = torch.tensor(t[-f.shape[0]:], dtype=torch.long)
            real[r, n - f.shape[0]:] = True
        hidden = self.fc(feats)
        pos = torch.arange(n, device=dev).expand(rows, -1)
        q, keys, values = self.qkv(hidden, toks, pos)
        q, h = q[:, :, -1:], hidden[:, -1:]
        out: list[torch.Tensor] = []
        for step in range(k):
            mask = real[:, None, None, :]
            logits, h = self.finish(self.attend(q, keys, values, mask), h)
            nxt = self.to_target(logits[:, -1].argmax(-1))
            out.append(nxt)
            if step + 1 < k:  # the draft's own output and its token become the next position
                q, k1, v1 = self.qkv(h, nxt[:, None], torch.full((rows, 1), n + step, device=dev))
                keys, values = torch.cat([keys, k1], 2), torch.cat([values, v1], 2)
                real = torch.cat([real, torch.ones((rows, 1), dtype=torch.bool, device=dev)], 1)
        return torch.stack(out, 1).tolist()

    # -- checkpoint -------------------------------------------------------------------------------------
    def save_pretrained(self, folder: str | Path, base_model: str = "") -> Path:
        """Write ``model.safetensors`` and ``config.json`` (see the module docstring); returns the folder."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().contiguous() for k, v in self.state_dict().items()
                 if not k.startswith(("embed.", "rotary."))}
        save_file(state, str(folder / WEIGHTS))
        c = self.config
        config = {
            "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
            "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
            "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
            "head_dim": c.head_dim, "num_hidden_layers": 1, "vocab_size": c.vocab_size,
            "draft_vocab_size": c.draft_vocab_size, "rms_norm_eps": c.rms_norm_eps,
            "rope_theta": _rope_theta(c), "max_position_embeddings": c.max_position_embeddings,
            "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "float32",
            "eagle_aux_hidden_state_layer_ids": list(self.aux_layers), "eagle_config": {"use_aux_hidden_state": True},
            "attention_window": self.attention_window, "base_model_name_or_path": base_model,
        }
        (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        return folder

    @classmethod
    def config_for(cls, target_config, aux_layers: Sequence[int] | None = None,
                   attention_window: int = DEFAULT_WINDOW, **overrides) -> LlamaConfig:
        """A head config shaped like the target's attention and MLP (``overrides`` replace any field)."""
        t = target_config
        kw = dict(hidden_size=t.hidden_size, intermediate_size=t.intermediate_size,
                  num_attention_heads=t.num_attention_heads,
                  num_key_value_heads=getattr(t, "num_key_value_heads", None) or t.num_attention_heads,
                  head_dim=getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads,
                  num_hidden_layers=1, vocab_size=t.vocab_size, rms_norm_eps=t.rms_norm_eps,
                  max_position_embeddings=t.max_position_embeddings,
                  rope_theta=_rope_theta(t))
        kw.update(overrides)
        c = LlamaConfig(**{k: v for k, v in kw.items() if k != "draft_vocab_size"})
        c.draft_vocab_size = int(kw.get("draft_vocab_size", t.vocab_size))
        c.aux_layers = tuple(aux_layers) if aux_layers is not None else default_aux_layers(t.num_hidden_layers)
        c.attention_window = attention_window
        return c

    @classmethod
    def from_pretrained(cls, folder: str | Path, embed_tokens: torch.Tensor, target_layers: int) -> Eagle3Head:
        """Load a head written by :meth:`save_pretrained` (or an EAGLE-3 checkpoint in the same layout) onto the
        target's input embedding ``embed_tokens [vocab, H]``; ``target_layers`` (the target's decoder layers) gives
        the default feature layers of a checkpoint that names none.

        Raises:
            ValueError: a missing or inconsistent file (the message names it).
        """
        folder = Path(folder)
        try:
            cfg = json.loads((folder / "config.json").read_text())
            weights = load_file(str(folder / WEIGHTS))
        except (OSError, json.JSONDecodeError, SafetensorError) as exc:
            raise ValueError(f"eagle3: cannot read an EAGLE-3 head in {folder}: {exc}") from None
        try:
            aux = cfg.get("eagle_aux_hidden_state_layer_ids") or default_aux_layers(target_layers)
            c = LlamaConfig(**{k: cfg[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                                   "num_key_value_heads", "vocab_size", "rms_norm_eps")},
                            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"],
                            num_hidden_layers=1, rope_theta=cfg.get("rope_theta", 10000.0),
                            max_position_embeddings=cfg.get("max_position_embeddings", 2048))
            c.draft_vocab_size = int(cfg.get("draft_vocab_size") or cfg["vocab_size"])
            if len(aux) != 3:
                raise ValueError(f"eagle_aux_hidden_state_layer_ids: {aux} (EAGLE-3 fuses three layers)")
            c.aux_layers = tuple(int(i) for i in aux)
            c.attention_window = int(cfg.get("attention_window", DEFAULT_WINDOW))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"eagle3: {folder}/config.json is not an EAGLE-3 config (bad or missing {exc})") from None
        if tuple(embed_tokens.shape) != (c.vocab_size, c.hidden_size):
            raise ValueError(f"eagle3: the head in {folder} is for vocabulary {c.vocab_size} and hidden size "
                             f"{c.hidden_size}, not this target's {tuple(embed_tokens.shape)}")
        head = cls(c, embed_tokens)
        weights.setdefault("t2d", torch.ones(c.vocab_size, dtype=torch.bool))
        weights.setdefault("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long))
        try:
            missing, unexpected = head.load_state_dict(weights, strict=False)
        except RuntimeError as exc:  # a tensor of the wrong shape
            raise ValueError(f"eagle3: {folder}/{WEIGHTS} does not match its config.json ({exc})") from None
        missing = [m for m in missing if not m.startswith(("embed.", "rotary."))]
        unexpected = [u for u in unexpected if u != "embed_tokens.weight"]
        if missing or unexpected:
            raise ValueError(f"eagle3: {folder}/{WEIGHTS} does not match its config.json "
                             f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
        return head.eval()


class Eagle3Proposer:
    """``method: eagle3``: each row's proposals come from the EAGLE-3 head over the target features of its last
    committed positions (``ProposalRow.features``: from its prefill, then from each verification forward). All
    rows run in one batched call."""

    method = "eagle3"

    def __init__(self, head: Eagle3Head) -> None:
        self.head = head

    def propose(self, rows: Sequence[ProposalRow]) -> list[Proposal]:
        out = [Proposal([]) for _ in rows]
        have = [i for i, r in enumerate(rows) if r.features is not None and len(r.features)]
        if not have:
            return out
        k = max(rows[i].k for i in have)
        chains = self.head.propose([rows[i].features for i in have], [rows[i].tokens for i in have], k)
        for j, i in enumerate(have):
            out[i] = Proposal(chains[j][: rows[i].k])
        return out
