"""Export the demo trio (or any small Qwen3/Llama checkpoint folder) to GGUF files that llama.cpp loads.

Why not llama.cpp's own ``convert_hf_to_gguf.py``: it refuses the demo trio's tokenizer. It tries sentencepiece,
then hashes a probe text through the Hugging Face pre-tokenizer to name llama.cpp's matching pre-tokenizer, and the
trio's (``"\\n\\n"`` isolated, digits split one by one, then byte-level BPE) has no entry. This project never lets
llama.cpp tokenize for it (the llamacpp backend takes token ids from the Hugging Face tokenizer of the same
folder), so the GGUF's vocabulary only has to carry the same ids, tokens and merges. This script writes the file
with the ``gguf`` package (gguf-py, the library the converter is built on): tensor names from its
``TensorNameMap`` for the architecture, hyperparameters under the keys llama.cpp reads for it, the vocabulary as
a byte-level BPE (``tokenizer.ggml.model = gpt2``) with the pre-tokenizer named ``qwen2`` (its regex splits digits
one by one, as the trio's does; it does not isolate ``"\\n\\n"``, so text tokenized by llama.cpp itself, e.g. a
prompt typed into ``llama-cli``, can differ from the Hugging Face ids: send token ids, as ``benchmarks/`` does).

The demo checkpoints are stored in float16; the matrices are written upcast to float32 (``--outtype f32``, the
profile's files) or as float16 (``--outtype f16``), exact either way, and ``--check`` runs the same prompt through
transformers and llama.cpp and compares the greedy tokens.

Usage:
  python build_scripts/export_gguf.py                       # engines/demo/{target,draft,judge} -> engines/demo/gguf/
  python build_scripts/export_gguf.py --model FOLDER --out FILE.gguf
  python build_scripts/export_gguf.py --check               # also compare greedy decoding with transformers

``make install`` writes ``engines/demo/gguf/`` with this script (git-ignored: a second copy of the checkpoints would
only grow the repository); ``tests/test_demo_llamacpp.py`` exports afresh and compares byte for byte and tensor by
tensor. Each file is written beside its destination and renamed into place, so an interrupted export leaves none.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "engines" / "demo"
ROLES = ("target", "draft", "judge")

#: Hugging Face ``model_type`` -> gguf-py architecture name (llama.cpp's ``general.architecture``).
ARCHES = {"qwen3": "QWEN3", "llama": "LLAMA"}


def _hf_state(folder: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"model: no *.safetensors in {folder}")
    state: dict[str, np.ndarray] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state


def _vocab(folder: Path, n_vocab: int):
    """(tokens, token types, merges, eos id, pad id) of the folder's byte-level BPE ``tokenizer.json``, padded to
    the model's ``n_vocab`` rows with unused ``[PAD{i}]`` entries (llama.cpp needs one entry per logit row)."""
    import gguf

    tok = json.loads((folder / "tokenizer.json").read_text())
    model = tok["model"]
    if model.get("type") != "BPE":
        raise ValueError(f"tokenizer: {folder / 'tokenizer.json'} is a {model.get('type')} model; this exporter "
                         "writes byte-level BPE vocabularies only")
    ids = dict(model["vocab"])
    special = {}
    for a in tok.get("added_tokens", []):
        ids[a["content"]] = a["id"]
        special[a["id"]] = a.get("special", True)
    if max(ids.values()) >= n_vocab:
        raise ValueError(f"tokenizer: {folder} has token id {max(ids.values())} but the model has {n_vocab} rows")
    tokens = [f"[PAD{i}]" for i in range(n_vocab)]
    types = [gguf.TokenType.UNUSED] * n_vocab
    for text, i in ids.items():
        tokens[i] = text
        types[i] = (gguf.TokenType.CONTROL if special.get(i) else gguf.TokenType.USER_DEFINED) if i in special \
            else gguf.TokenType.NORMAL
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    cfg_path = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
    eos = ids.get(cfg.get("eos_token")) if isinstance(cfg.get("eos_token"), str) else None
    pad = ids.get(cfg.get("pad_token")) if isinstance(cfg.get("pad_token"), str) else None
    return tokens, types, merges, eos, pad


def export(folder: Path, out: Path, outtype: str = "f32") -> Path:
    """Write ``folder`` (a Hugging Face checkpoint: ``config.json``, safetensors, ``tokenizer.json``) as one GGUF.

    Args:
        folder: the checkpoint folder; ``model_type`` must be one of :data:`ARCHES`.
        out: the GGUF file to write (its folder is created).
        outtype: ``f32`` or ``f16`` for the matrices (norms and other 1-D tensors stay float32, as llama.cpp's
            converter writes them); the demo checkpoints are stored in float16, so both are exact.
    Returns:
        ``out``.
    Raises:
        ValueError: an unsupported architecture or tokenizer, or a tensor the architecture's name map does not
            know (naming the file and field).
    """
    import gguf

    cfg = json.loads((folder / "config.json").read_text())
    mtype = cfg.get("model_type")
    if mtype not in ARCHES:
        raise ValueError(f"model_type: {folder / 'config.json'} says {mtype!r}; exportable: {', '.join(ARCHES)}")
    arch = getattr(gguf.MODEL_ARCH, ARCHES[mtype])
    n_layer = int(cfg["num_hidden_layers"])
    names = gguf.get_tensor_name_map(arch, n_layer)
    state = _hf_state(folder)
    n_vocab = int(cfg["vocab_size"])
    head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])
    rope = (cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta", 10000.0))

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    w = gguf.GGUFWriter(str(tmp), gguf.MODEL_ARCH_NAMES[arch])
    w.add_name(folder.name)
    if outtype not in ("f32", "f16"):
        raise ValueError(f"outtype: 'f32' or 'f16', got {outtype!r}")
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if outtype == "f32" else gguf.LlamaFileType.MOSTLY_F16)
    w.add_context_length(int(cfg["max_position_embeddings"]))
    w.add_embedding_length(int(cfg["hidden_size"]))
    w.add_block_count(n_layer)
    w.add_feed_forward_length(int(cfg["intermediate_size"]))
    w.add_head_count(int(cfg["num_attention_heads"]))
    w.add_head_count_kv(int(cfg.get("num_key_value_heads", cfg["num_attention_heads"])))
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(float(rope))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    tokens, types, merges, eos, pad = _vocab(folder, n_vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    eos = eos if eos is not None else cfg.get("eos_token_id")
    if isinstance(eos, int):
        w.add_eos_token_id(eos)
    pad = pad if pad is not None else cfg.get("pad_token_id")
    if isinstance(pad, int):
        w.add_pad_token_id(pad)
    w.add_add_bos_token(False)
    template = folder / "chat_template.jinja"
    if template.exists():
        w.add_chat_template(template.read_text())

    for hf_name in sorted(state, key=_layer_order):
        dtype = np.float16 if outtype == "f16" and state[hf_name].ndim == 2 else np.float32
        arr = np.ascontiguousarray(state[hf_name].astype(dtype))
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ValueError(f"tensor: {hf_name!r} of {folder} has no GGUF name for {mtype}")
        w.add_tensor(name, arr)
    if "lm_head.weight" not in state and not cfg.get("tie_word_embeddings", False):
        raise ValueError(f"tie_word_embeddings: {folder} has no lm_head.weight and does not tie it")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(out)
    return out


def _layer_order(name: str):
    parts = name.split(".")
    layer = next((int(p) for p in parts if p.isdigit()), -1)
    return (layer, name)


def check(folder: Path, gguf_file: Path, new_tokens: int = 48) -> tuple[int, int]:
    """Greedy-decode one prompt with transformers and with llama.cpp (llama-cpp-python) on the exported file.

    Returns:
        ``(agreeing, generated)``: the leading tokens both wrote alike, and how many transformers wrote (fewer than
        ``new_tokens`` when it ended with EOS).
    """
    import llama_cpp
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    prompt = tok.apply_chat_template([{"role": "user", "content": "Ana has 3 boxes with 4 pens each. She gives away "
                                                                   "5 pens. How many pens does she have?"}],
                                     add_generation_prompt=True, tokenize=True)
    prompt = list(prompt["input_ids"] if isinstance(prompt, dict) or hasattr(prompt, "keys") else prompt)
    ref = model.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False)[0, len(prompt):].tolist()
    llm = llama_cpp.Llama(str(gguf_file), n_ctx=1024, n_threads=2, verbose=False)
    got = []
    for t in llm.generate(prompt, temp=0.0, top_k=1, repeat_penalty=1.0):
        got.append(int(t))
        if len(got) >= len(ref) or t == llm.token_eos():
            break
    agree = next((i for i, (a, b) in enumerate(zip(ref, got, strict=False)) if a != b), min(len(ref), len(got)))
    return agree, len(ref)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None, help="one checkpoint folder (default: the demo trio)")
    ap.add_argument("--out", type=Path, default=None, help="the GGUF file for --model")
    ap.add_argument("--out-dir", type=Path, default=DEMO / "gguf", help="where the trio's files go")
    ap.add_argument("--outtype", choices=("f32", "f16"), default="f32", help="matrix type (default f32)")
    ap.add_argument("--check", action="store_true", help="compare greedy decoding with transformers afterwards")
    args = ap.parse_args(argv)
    if args.model is not None:
        jobs = [(args.model, args.out or args.model.with_suffix(".gguf"))]
    else:
        jobs = [(DEMO / r, args.out_dir / f"{r}-{args.outtype}.gguf") for r in ROLES]
    for folder, out in jobs:
        export(folder, out, args.outtype)
        line = f"{folder} -> {out} ({out.stat().st_size / 1e6:.2f} MB)"
        if args.check:
            agree, n = check(folder, out)
            line += f"; greedy tokens agreeing with transformers: {agree} of {n}"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
