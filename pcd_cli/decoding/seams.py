"""Tokenizing the record part of the prompt in context: the record text, the text after it, their seams.

The prompt of a record is ``head + record text + tail`` (``prompt.Prompt``), and the
compiled plans (wave contexts, answer lines) are shared by every record. Three rules keep
each record's tokens exactly those of its whole prompt, tokenized at once:

1. **Text after the record is tokenized in context** (``encode_after``): after an *anchor*,
   a short text standing where a record ends (``Input:\\nx``), whose tokens are then
   stripped. Never on its own: SentencePiece-style tokenizers (Llama 2, Mistral, Phi-3:
   a normaliser or Metaspace pre-tokenizer that prepends ``▁``) give a text that starts a
   string a ``▁`` it does not have inside the prompt, so a tail tokenized alone never
   matches the end of any record's prompt.
2. **The record's chain takes in the tail tokens the tokenizer merges** (``RecordTail``):
   a plain prompt and a BPE that glues punctuation to the newlines after it (Qwen2.5,
   Llama 3) tokenize ``"done." + "\\n\\nJSON answer:"`` as ``done`` ``.\\n\\n`` ``JSON``...,
   so the first tail tokens depend on the record. Only the *fixed tail* must match: the
   tail tokens that every probe record's prompt ends with (records ending in a letter, a
   digit, ``.``, ``!``, ``?``, a quote...), at least the tail tokens the first wave's
   forests re-feed, and at least the last one. The tokens before it are fed as the
   record's own. (This assumes merges are local: a record that leaves the end of the tail
   as compiled leaves the answer lines after it as compiled too; true of BPE behind a
   pre-tokenizer, and checked by the oracle tests for SentencePiece-style BPE.)
3. **Record text is always text** (``RecordGuard``): special-token strings in a record
   (``<|im_end|>``, ``<|im_start|>``, ``<s>``, ``[INST]``) are tokenized as ordinary text,
   so an untrusted record cannot close its turn and write its own answer. The prompt is
   cut at the special tokens around the record (found in the trusted head and tail), the
   piece holding the record is tokenized with ``encode_text`` (special tokens split) and
   spliced between the trusted pieces. Splicing is checked once per prompt against the
   plain tokenization of clean probe records; where it differs (an unusual tokenizer), a
   record holding special-token text fails rather than being tokenized as control tokens.

Every seam is still checked per record: the head (``Prompt.record_ids``) and the fixed
tail (``RecordTail.chain``); a record that breaks one fails with a ``RecordError`` naming
it, and ``pcd inspect-schema`` runs the same checks on probe records (``probe_records``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..errors import CompileError, RecordError

#: Texts put where a record ends to tokenize what follows it (the first that stays a token
#: prefix of itself followed by the tail is kept).
ANCHOR_PROBES = ("x", "ok", "1", "Q")
#: Record texts ending in different kinds of character: the fixed tail is what all their
#: prompts end with; ``inspect-schema`` checks each (with ``prompt.HEAD_PROBES``).
TAIL_PROBES = ("x", "Q", "1", ".", "!", "?", ")", "\"", "'", ":", "-", "x.", "ok!", "why?", "你", "é", "😀")
#: Clean records the splice of rule 3 is checked on (no special-token strings in them).
SPLICE_PROBES = ("x", "Done. Next!")


def encode_after(tokenizer, anchor: str, anchor_ids: Sequence[int], text: str) -> list[int]:
    """Tokens of ``text`` as it tokenizes after ``anchor`` (rule 1).

    Args:
        anchor_ids: ``tokenizer.encode(anchor)``.

    Raises:
        CompileError: ``text`` merges into the anchor (the anchor was not checked for it).
    """
    ids = tokenizer.encode(anchor + text)
    n = len(anchor_ids)
    if list(ids[:n]) != list(anchor_ids):
        raise CompileError(f"the tokenizer merges {text[:40]!r} into the text before it ({anchor!r}); "
                           "pcd cannot tokenize the prompt's tail in context")
    return ids[n:]


def pick_anchor(tokenizer, head_text: str, tail_text: str, input_label: str) -> tuple[str, tuple[int, ...]]:
    """The anchor for ``encode_after``: ``input_label`` (or the head's last 32 characters) and
    a probe record, the first whose tokens stay a prefix when ``tail_text`` follows.

    Raises:
        CompileError: every probe merges with the tail.
    """
    before = input_label if head_text.endswith(input_label) else head_text[-32:]
    for probe in ANCHOR_PROBES:
        anchor = before + probe
        ids = tuple(tokenizer.encode(anchor))
        if tuple(tokenizer.encode(anchor + tail_text)[: len(ids)]) == ids:
            return anchor, ids
    raise CompileError(f"the tokenizer merges every probe record into the prompt's tail {tail_text[:40]!r}; "
                       "pcd cannot tell where a record's tokens end")


@dataclass(frozen=True)
class RecordTail:
    """Where a record's tokens end and the compiled tail begins (rule 2).

    Attributes:
        tail_ids: the tail's tokens in context (after the anchor).
        refed: tokens at the end of ``tail_ids`` that the first wave's forests feed (not the chain).
        fixed: tokens at the end of ``tail_ids`` that every probe record's prompt ends with.
    """

    tail_ids: tuple[int, ...]
    refed: int
    fixed: int

    @property
    def required(self) -> int:
        """Tokens every record's prompt must end with: the fixed tail, at least the re-fed part,
        and at least the last tail token (a record whose merge reaches the end of the tail
        would reach the answer lines too)."""
        return min(len(self.tail_ids), max(self.fixed, self.refed, 1))

    def chain(self, record_id: object, after: Sequence[int]) -> list[int]:
        """The tokens fed as the record's own in wave 0: ``after`` (the prompt's tokens after
        the head) without the re-fed tail tokens.

        Raises:
            RecordError: the prompt does not end with the required tail tokens.
        """
        need = self.required
        if len(after) <= need or tuple(after[len(after) - need:]) != self.tail_ids[len(self.tail_ids) - need:]:
            raise RecordError(f"record {record_id!r}: the tokenizer merges the end of the text into the prompt "
                              f"that follows it, beyond the {need} tail tokens every record must end with; "
                              "its answer lines would not tokenize as compiled (pcd inspect-schema shows which "
                              "record endings are affected)")
        return list(after[: len(after) - self.refed])


def fixed_tail_len(tail_ids: Sequence[int], prompts_after: Sequence[Sequence[int]]) -> int:
    """Length of the longest common suffix of ``tail_ids`` and every probe's tokens after the head."""
    n = len(tail_ids)
    for after in prompts_after:
        k = 0
        while k < n and k < len(after) and after[len(after) - 1 - k] == tail_ids[len(tail_ids) - 1 - k]:
            k += 1
        n = k
    return n


@dataclass(frozen=True)
class RecordGuard:
    """Keeps special-token strings in record text from becoming control tokens (rule 3).

    Attributes:
        special_texts: the tokenizer's special-token strings.
        special_ids: their ids.
        template_specials: special-token ids in a clean record's prompt (the template's own).
        exact: splicing reproduces the plain tokenization of the clean probes.
    """

    special_texts: tuple[str, ...]
    special_ids: frozenset[int]
    template_specials: int
    exact: bool

    @classmethod
    def build(cls, tokenizer, probes: Sequence[tuple[str, int, int]]) -> "RecordGuard":
        """Check splicing on clean probe prompts ``(full text, record start, record end)``."""
        texts = tuple(getattr(tokenizer, "special_texts", ()))
        ids = frozenset(getattr(tokenizer, "special_ids", ()))
        if not hasattr(tokenizer, "encode_text"):
            return cls(texts, ids, 0, False)
        full, start, end = probes[0]
        count = sum(t in ids for t in tokenizer.encode(full))
        exact = all(splice(tokenizer, texts, f, s, e) == tokenizer.encode(f) for f, s, e in probes)
        return cls(texts, ids, count, exact)

    def encode(self, tokenizer, record_id: object, full: str, start: int, end: int) -> list[int]:
        """Tokens of the prompt ``full`` whose characters ``[start, end)`` are record text.

        Raises:
            RecordError: the record holds special-token text and splicing is not exact for this
                tokenizer, or its prompt still has more special tokens than the template's own.
        """
        record = full[start:end]
        found = [t for t in self.special_texts if t in record]
        ids = tokenizer.encode(full)
        if not found and sum(t in self.special_ids for t in ids) == self.template_specials:
            return ids
        shown = found[0] if found else "a special token"
        if not self.exact:
            raise RecordError(f"record {record_id!r}: its text holds the special-token string {shown!r}, and this "
                              "tokenizer cannot tokenize it as plain text inside the prompt exactly; remove it "
                              "from the text (pcd never lets record text act as a control token)")
        ids = splice(tokenizer, self.special_texts, full, start, end)
        if sum(t in self.special_ids for t in ids) != self.template_specials:
            raise RecordError(f"record {record_id!r}: its text forms a special token with the prompt around it "
                              f"({shown!r}); remove it from the text")
        return ids


def splice(tokenizer, special_texts: Sequence[str], full: str, start: int, end: int) -> list[int]:
    """``full`` tokenized in three pieces: up to the last special token before ``start``, the
    piece holding ``[start, end)`` with special-token strings as text (``encode_text``), and
    from the first special token at or after ``end``. A tokenizer splits its input at special
    tokens before anything else, so the pieces tokenize as they do inside ``full``."""
    s0 = max((full.rfind(t, 0, start) + len(t) for t in special_texts if full.rfind(t, 0, start) >= 0), default=0)
    found = [p for p in (full.find(t, end) for t in special_texts) if p >= 0]
    s1 = min(found, default=len(full))
    left = tokenizer.encode(full[:s0]) if s0 else []
    right = tokenizer.encode(full[s1:]) if s1 < len(full) else []
    return list(left) + list(tokenizer.encode_text(full[s0:s1], at_start=s0 == 0)) + list(right)
