"""Tokenizer access shared by every backend: encode/decode, chat templates, EOS ids, context length.

Backends that do not run the model in-process (Triton, OpenAI-compatible HTTP, TensorRT-LLM) still load the
Hugging Face tokenizer and config from a local checkpoint folder so the orchestrator works on token ids.
"""

from __future__ import annotations

from collections.abc import Sequence


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
        """Token ids of ``text`` with special tokens kept literal (``split_special_tokens``): ``<|im_start|>`` typed
        by a user is characters, never a control token. Only :meth:`apply_chat_template` adds control tokens."""
        return self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True) -> list[int]:
        """Prompt ids of chat ``messages`` through the tokenizer's chat template, the messages' text literal.

        The template is rendered to text; each message's content is found in it (in order) and tokenized with
        special tokens split, the template's own text with them recognised, so a user cannot forge a chat turn
        by typing ``<|im_start|>``. Tokenizing in pieces gives the same ids as the whole text where the content
        holds no special token: the pieces meet at a special token or a newline, where byte-level BPE's
        pre-tokenizer splits anyway (``tests/test_engine.py`` checks it). A content the template rewrote (not found
        verbatim, nor stripped) is tokenized with the template text.

        Raises:
            ValueError: the tokenizer has no chat template.
        """
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError("messages: this model's tokenizer has no chat template; send a plain prompt")
        text = self.tokenizer.apply_chat_template(list(messages), tokenize=False,
                                                  add_generation_prompt=add_generation_prompt)
        pieces: list[tuple[str, bool]] = []
        pos = 0
        for m in messages:
            content = m.get("content")
            if not isinstance(content, str) or not content.strip():
                continue
            for needle in (content, content.strip()):
                at = text.find(needle, pos)
                if at >= 0:
                    pieces += [(text[pos:at], False), (needle, True)]
                    pos = at + len(needle)
                    break
        pieces.append((text[pos:], False))
        ids: list[int] = []
        for piece, literal in pieces:
            if piece:
                ids += self.tokenizer.encode(piece, add_special_tokens=False, split_special_tokens=literal)
        return ids

    def _load_tokenizer(self, path: str, model_config=None, generation_config=None) -> None:
        """Load tokenizer + limits from a checkpoint folder (configs read from it unless given).

        Raises:
            ValueError: naming ``model`` and the folder when it holds no usable tokenizer (transformers then builds
                an empty vocabulary, and every prompt would encode to nothing), or one with more tokens than the
                model's embedding has rows.
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
        if len(self.tokenizer) > self._vocab:
            raise ValueError(f"model: {path}: the tokenizer has {len(self.tokenizer)} tokens but the model's "
                             f"embedding has {self._vocab} rows (config.json vocab_size): tokenizer and weights differ")
        self._context = int(getattr(model_config, "max_position_embeddings", 2048))
