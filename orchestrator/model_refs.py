"""Model references: a Hugging Face folder, a GGUF file, or ``package:NAME/FILE`` inside an installed package.

GGUF weights are dequantised once by transformers (``from_pretrained(dir, gguf_file=...)``, which needs the
``gguf`` package) and cached as a safetensors folder (with tokenizer and chat template) under the cache
directory (``$LOOKAHEAD_CACHE_DIR``, default ``~/.cache/lookahead-reasoning``), keyed by the file's name, size
and modification time, so the second load is an ordinary, fast safetensors load.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

PACKAGE_PREFIX = "package:"


def cache_dir() -> Path:
    return Path(os.environ.get("LOOKAHEAD_CACHE_DIR", Path.home() / ".cache" / "lookahead-reasoning"))


def locate(ref: str, base: Path | None = None) -> Path:
    """The file or folder a reference names (no conversion).

    Raises:
        ValueError: a ``package:`` reference to a package that is not installed, or a missing path.
    """
    if ref.startswith(PACKAGE_PREFIX):
        rest = ref[len(PACKAGE_PREFIX):]
        if "/" not in rest:
            raise ValueError(f"path: {ref!r} must look like package:NAME/FILE")
        package, inner = rest.split("/", 1)
        from importlib import resources

        try:
            root = resources.files(package)
        except ModuleNotFoundError:
            raise ValueError(f"path: package {package!r} of {ref!r} is not installed") from None
        path = Path(str(root / inner))
    else:
        path = Path(ref).expanduser()
        if not path.is_absolute() and base is not None:
            path = base / path
    if not path.exists():
        raise ValueError(f"path: {ref!r} does not exist ({path})")
    return path


def _gguf_key(path: Path) -> str:
    st = path.stat()
    digest = hashlib.sha256(f"{path.name}|{st.st_size}|{int(st.st_mtime)}".encode()).hexdigest()[:16]
    return f"{path.stem}-{digest}"


def resolve(ref: str, base: Path | None = None, cache: Path | None = None) -> Path:
    """A Hugging Face checkpoint folder for ``ref`` (converting and caching GGUF files on first use).

    Args:
        ref: folder, ``*.gguf`` file, or ``package:NAME/FILE``.
        base: folder that relative paths are resolved against.
        cache: where dequantised GGUF checkpoints go (default :func:`cache_dir`).
    Returns:
        the folder to pass to ``from_pretrained``.
    Raises:
        ValueError: a missing path (see :func:`locate`), or a GGUF file transformers cannot read (naming it).
    """
    path = locate(ref, base)
    if path.is_dir() or path.suffix != ".gguf":
        return path
    out = (cache or cache_dir()) / "gguf" / _gguf_key(path)
    if (out / "config.json").exists():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")  # per process: several model processes may convert at once
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name)
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as exc:  # noqa: BLE001 - transformers raises many kinds; one line naming the file instead
        raise ValueError(f"path: transformers could not read the GGUF {path} ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else 'no message'}); for runtimes llamacpp and "
                         "openai, a `tokenizer` folder in the model spec avoids dequantising it") from None
    # The weights are already dequantised to float tensors; drop the GGUF marker so they save as plain
    # safetensors (transformers refuses to serialise a model it considers GGUF-quantised).
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    try:
        tmp.rename(out)  # atomic: a half-written cache is never used
    except OSError:
        if not (out / "config.json").exists():
            raise
        shutil.rmtree(tmp, ignore_errors=True)  # another process finished first
    return out
