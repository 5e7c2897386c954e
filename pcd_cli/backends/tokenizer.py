"""The tokenizer side of the backend contract, over a transformers tokenizer.

Framework-free (no torch, no mlx): every backend wraps its Hugging Face tokenizer in
``HFTokenizer`` so that prompts, label tries and seams are identical across backends.
"""

from __future__ import annotations

from typing import Sequence

#: Date handed to chat templates that print one, so the head never changes at midnight.
PINNED_DATE = "01 Jan 2025"
#: Arguments every chat template is rendered with (DESIGN.md §2 rule 1); a template ignores
#: those it does not read.
CHAT_TEMPLATE_ARGS = {"add_generation_prompt": True, "enable_thinking": False, "date_string": PINNED_DATE}


class HFTokenizer:
    """The tokenizer side of the backend contract, over a transformers tokenizer."""

    def __init__(self, tokenizer):
        self._tok = tokenizer
        self.vocab_size = len(tokenizer)
        bos = getattr(tokenizer, "bos_token", None)
        self.bos_text = bos if (bos and getattr(tokenizer, "add_bos_token", False)) else ""

    def encode(self, text: str) -> list[int]:
        return self._tok(text, add_special_tokens=False)["input_ids"]

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
        """Render ``messages`` with ``CHAT_TEMPLATE_ARGS`` (``overrides`` replace some, for probes)."""
        if not getattr(self._tok, "chat_template", None):
            return None
        kwargs = dict(tokenize=False, **{**CHAT_TEMPLATE_ARGS, **overrides})
        try:
            return self._tok.apply_chat_template(messages, **kwargs)
        except Exception:  # noqa: BLE001 - templates that refuse a system turn raise arbitrary errors
            if messages and messages[0]["role"] == "system":
                merged = [{"role": "user", "content": messages[0]["content"] + "\n\n" + messages[1]["content"]}]
                return self._tok.apply_chat_template(merged, **kwargs)
            raise
