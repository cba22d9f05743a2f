"""Tokenizer access shared by every backend: encode/decode, chat templates, EOS ids, context length.

Backends that do not run the model in-process (Triton, OpenAI-compatible HTTP, TensorRT-LLM) still load the
Hugging Face tokenizer and config from a local checkpoint folder so the orchestrator works on token ids.
"""

from __future__ import annotations

from typing import Sequence


class TokenizerAccess:
    """Mixin: needs ``self.tokenizer`` (a Hugging Face tokenizer), ``self._eos``, ``self._context``, ``self._vocab``."""

    tokenizer: object
    _eos: frozenset[int]
    _context: int
    _vocab: int

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self._eos

    @property
    def context_length(self) -> int:
        return self._context

    @property
    def vocab_size(self) -> int:
        return self._vocab

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True) -> list[int]:
        """Prompt ids of chat ``messages`` through the tokenizer's chat template.

        Raises:
            ValueError: the tokenizer has no chat template.
        """
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError("messages: this model's tokenizer has no chat template; send a plain prompt")
        out = self.tokenizer.apply_chat_template(
            list(messages), tokenize=True, add_generation_prompt=add_generation_prompt, return_dict=False
        )
        return list(out["input_ids"] if isinstance(out, dict) else out)

    def _load_tokenizer(self, path: str, model_config=None, generation_config=None) -> None:
        """Load tokenizer + limits from a checkpoint folder (configs read from it unless given).

        Raises:
            ValueError: naming ``model`` when the folder holds no usable tokenizer (transformers then builds an
                empty vocabulary, and every prompt would encode to nothing).
        """
        from transformers import AutoConfig, AutoTokenizer, GenerationConfig

        self.tokenizer = AutoTokenizer.from_pretrained(path)
        if len(self.tokenizer) < 2 or not self.tokenizer.encode("a", add_special_tokens=False):
            raise ValueError(f"model: {path} has no usable tokenizer (tokenizer.json or the files of a "
                             "slow tokenizer): it encodes text to nothing")
        if model_config is None:
            model_config = AutoConfig.from_pretrained(path)
        if generation_config is None:
            try:
                generation_config = GenerationConfig.from_pretrained(path)
            except OSError:
                generation_config = None
        eos = set()
        gen_eos = getattr(generation_config, "eos_token_id", None)
        for e in gen_eos if isinstance(gen_eos, (list, tuple)) else [gen_eos]:
            if e is not None:
                eos.add(int(e))
        if self.tokenizer.eos_token_id is not None:
            eos.add(int(self.tokenizer.eos_token_id))
        self._eos = frozenset(eos)
        self._vocab = int(model_config.vocab_size)
        self._context = int(getattr(model_config, "max_position_embeddings", 2048))
