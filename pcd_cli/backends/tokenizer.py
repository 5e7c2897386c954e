"""The tokenizer side of the backend contract, over a transformers tokenizer.

Framework-free (no torch, no mlx): every backend wraps its Hugging Face tokenizer in
``HFTokenizer`` so that prompts, label tries and seams are identical across backends.
"""

from __future__ import annotations

import json
from typing import Sequence

#: Date handed to chat templates that print one, so the head never changes at midnight.
PINNED_DATE = "01 Jan 2025"
#: Arguments every chat template is rendered with (docs/how-it-works.md, decoding rule 1); a template ignores
#: those it does not read.
CHAT_TEMPLATE_ARGS = {"add_generation_prompt": True, "enable_thinking": False, "date_string": PINNED_DATE}


def _without_first_prepend(tokenizer):
    """A copy of ``tokenizer``'s fast tokenizer whose Metaspace pre-tokenizers prepend ``▁``
    never instead of at the start of the text only (``prepend_scheme="first"``), encoding
    special-token strings as text; ``None`` when it has no such pre-tokenizer (then a piece
    tokenizes the same wherever it stands)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or "Metaspace" not in str(backend.pre_tokenizer):
        return None
    spec = json.loads(backend.to_str())
    changed = False

    def walk(node):
        nonlocal changed
        if isinstance(node, dict):
            if node.get("type") == "Metaspace" and node.get("prepend_scheme") == "first":
                node["prepend_scheme"] = "never"
                changed = True
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(spec.get("pre_tokenizer"))
    if not changed:
        return None
    from tokenizers import Tokenizer

    variant = Tokenizer.from_str(json.dumps(spec))
    variant.encode_special_tokens = True
    return variant


class HFTokenizer:
    """The tokenizer side of the backend contract, over a transformers tokenizer."""

    def __init__(self, tokenizer):
        self._tok = tokenizer
        self.vocab_size = len(tokenizer)
        bos = getattr(tokenizer, "bos_token", None)
        self.bos_text = bos if (bos and getattr(tokenizer, "add_bos_token", False)) else ""
        self._not_first: object = ...  # built on first use (``encode_text(at_start=False)``)

    @property
    def content_key(self) -> str:
        """SHA-256 (hex) of everything this tokenizer does to a text: its full specification
        (vocabulary, merges, normalizer, pre-tokenizer, added and special tokens: the fast
        tokenizer's ``to_str()``; a slow one's vocabulary and added tokens), the chat template's
        source, the template arguments pcd renders with, and the BOS text pcd writes. Read from the
        loaded tokenizer, so a ``.gguf`` file, a folder, a hub model and either backend are keyed
        alike (``pcd_cli.job_fingerprint``, the ``tokenizer`` part). Taken once."""
        cached = getattr(self, "_content_key", None)
        if cached is not None:
            return cached
        import hashlib

        digest = hashlib.sha256()
        backend = getattr(self._tok, "backend_tokenizer", None)
        if backend is not None:
            digest.update(backend.to_str().encode("utf-8", "surrogatepass"))
        else:
            digest.update(json.dumps(sorted(self._tok.get_vocab().items()), ensure_ascii=False).encode())
        added = sorted((i, t.content, bool(t.special), bool(getattr(t, "lstrip", False)),
                        bool(getattr(t, "rstrip", False)), bool(getattr(t, "normalized", False)))
                       for i, t in self._tok.added_tokens_decoder.items())
        for part in (json.dumps(added, ensure_ascii=False), self.chat_template or "",
                     json.dumps(CHAT_TEMPLATE_ARGS, sort_keys=True), self.bos_text,
                     json.dumps({k: str(v) for k, v in sorted(getattr(self._tok, "special_tokens_map", {}).items())})):
            digest.update(b"\0" + part.encode("utf-8", "surrogatepass"))
        self._content_key = digest.hexdigest()
        return self._content_key

    def encode(self, text: str) -> list[int]:
        return self._tok(text, add_special_tokens=False)["input_ids"]

    def encode_text(self, text: str, *, at_start: bool = True) -> list[int]:
        """Tokenize ``text`` as plain text: special-token strings in it (``<|im_end|>``, ``<s>``)
        become ordinary text tokens, never control ids (``split_special_tokens=True``).

        ``at_start=False`` tokenizes it as a piece that follows a special token inside a
        longer text: a Metaspace pre-tokenizer with ``prepend_scheme="first"`` (Mistral v0.3,
        Llama tokenizers converted with ``legacy=False``) then prepends no ``▁``, as it does not
        inside the prompt.
        """
        if not at_start and self._not_first is ...:
            self._not_first = _without_first_prepend(self._tok)
        if at_start or self._not_first is None:
            return self._tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        return self._not_first.encode(text, add_special_tokens=False).ids

    @property
    def special_ids(self) -> frozenset[int]:
        """Ids of the special (control) tokens: ``<|im_start|>``, ``<s>``, ``[INST]``..."""
        return frozenset(i for i, t in self._tok.added_tokens_decoder.items() if t.special)

    @property
    def special_texts(self) -> tuple[str, ...]:
        """The strings of the special tokens, longest first."""
        texts = {t.content for t in self._tok.added_tokens_decoder.values() if t.special and t.content}
        return tuple(sorted(texts, key=lambda t: (-len(t), t)))

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    @property
    def chat_args(self) -> dict:
        """The arguments ``render_chat`` passes to the chat template (a copy)."""
        return dict(CHAT_TEMPLATE_ARGS)

    @property
    def chat_template(self) -> str | None:
        """The chat template's source (``None`` without one; named templates joined)."""
        template = getattr(self._tok, "chat_template", None)
        return "\n".join(template.values()) if isinstance(template, dict) else template

    def render_chat(self, messages: list[dict], **overrides) -> str | None:
        """Render ``messages`` with ``CHAT_TEMPLATE_ARGS`` (``overrides`` replace some, for probes).

        Renders exactly the turns given; ``prompt.render_turns`` decides where the system text
        goes. Raises ``ValueError`` when the template refuses them (``raise_exception``: "System
        role not supported", "roles must alternate").
        """
        if not getattr(self._tok, "chat_template", None):
            return None
        kwargs = dict(tokenize=False, **{**CHAT_TEMPLATE_ARGS, **overrides})
        try:
            return self._tok.apply_chat_template(messages, **kwargs)
        except Exception as exc:  # noqa: BLE001 - templates refuse roles with arbitrary errors (raise_exception)
            reason = (str(exc).splitlines() or [type(exc).__name__])[0]
            raise ValueError(f"the chat template refused these messages ({reason})") from exc
