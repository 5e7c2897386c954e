"""Schema + tokenizer -> the prompt: head text and ids, per-record text, JSON layout.

The prompt (DESIGN.md §2 rules 1 and 9; seed article 1, "The prompt every finding starts
from"): a system turn with instructions and a catalog listing every key, its description
and every allowed value; a user turn ``Input:\\n<record text>``; the assistant turn opened
by the model's own chat template, followed by the JSON opener. Models without a chat
template get a plain-text fallback.

The *head* is the longest token prefix identical for every record: the rendered text up
to the record, cut back (if needed) to the longest common token prefix over probe texts
that start with a letter, digit, punctuation, CJK character or quote.

Few-shot examples (issue #9) are prior exchanges in the head: per example, a user turn
``Input:\n<example text>`` and an assistant turn holding the complete answer object in
exactly the layout and canonical spellings the decoder writes and scores
(``answer_object``). The record's own user turn follows. Without a chat template the same
exchanges are plain-text blocks. Being part of the head, their KV is computed once per run.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from .errors import RecordError
from .schema import Field, Schema, json_string

PREAMBLE = ("You are a precise classification engine. Read the input and fill in a JSON object with "
            "exactly the keys listed below. Every value must be copied exactly from that key's allowed options.")
INPUT_LABEL = "Input:\n"
PLAIN_ANSWER_CUE = "\n\nJSON answer:\n"
#: Record texts whose first characters differ in kind; the head must not depend on them.
HEAD_PROBES = ("x", "Q", "1", "!", "\"", "(", "@", "你", "é", "-")


@dataclass(frozen=True)
class Layout:
    """How the JSON object is laid out (DESIGN.md §2 rule 4).

    ``"newline_first"``: ``{`` + ``\\n  "k": v,`` ... ``\\n  "k": v`` + ``\\n}`` (the newline
    opens each line; suits tokenizers that glue ``\\n`` to the indentation after it, e.g.
    SmolLM2). ``"newline_last"``: ``{\\n`` + ``  "k": v,\\n`` ... ``  "k": v\\n`` + ``}``
    (suits tokenizers that glue ``\\n`` to the punctuation before it, e.g. Qwen2.5).
    """

    name: str

    @property
    def opener(self) -> str:
        return "{" if self.name == "newline_first" else "{\n"

    def line(self, field: Field, spelling: str, *, last: bool) -> str:
        """The complete answer line for ``field`` written as ``spelling``, line ending included."""
        body = f"  {json_string(field.name)}: {spelling}"
        if self.name == "newline_first":
            return "\n" + body + ("\n}" if last else ",")
        return body + ("\n" if last else ",\n")


LAYOUTS = (Layout("newline_first"), Layout("newline_last"))


def catalog_line(field: Field) -> str:
    """``- "key": description. Allowed: "A" | "B"`` (booleans: ``true | false``)."""
    allowed = " | ".join(field.spellings(i)[0] for i in range(len(field.labels)))
    description = field.description.rstrip(".")
    text = f"- {json_string(field.name)}: "
    if description:
        text += f"{description}. "
    return text + f"Allowed: {allowed}"


def answer_object(schema: Schema, layout: Layout, labels: tuple[int, ...]) -> str:
    """The complete JSON answer for ``labels`` (label index per field), as the decoder writes it.

    Every line is ``Layout.line`` with the label's canonical spelling, so an example's answer
    tokenizes like the lines the decoder scores; the object is closed with ``}``.
    """
    n = len(schema.fields)
    lines = "".join(layout.line(f, f.spellings(labels[i])[0], last=i == n - 1) for i, f in enumerate(schema.fields))
    text = layout.opener + lines
    return text if text.endswith("}") else text + "}"


def system_text(schema: Schema) -> str:
    parts = [PREAMBLE]
    if schema.instructions:
        parts.append(schema.instructions)
    return "\n".join(parts) + "\n\nKeys:\n" + "\n".join(catalog_line(f) for f in schema.fields)


@dataclass(frozen=True)
class Prompt:
    """The rendered prompt, split into the shared head and the per-record part.

    Attributes:
        head_text: text identical for every record, up to the record text.
        head_ids: its tokens (possibly a few tokens shorter than ``encode(head_text)``, see module doc).
        tail_text: text after the record text: the template's close of the user turn, the
            assistant turn's opening and the JSON opener.
        chat_template: whether the model's chat template was used (else plain-text fallback).
        layout: the JSON layout.
    """

    head_text: str
    head_ids: tuple[int, ...]
    tail_text: str
    chat_template: bool
    layout: Layout
    _system: str
    _tokenizer: object
    #: ``(input text, answer object)`` of each few-shot example, in order.
    examples: tuple[tuple[str, str], ...] = ()

    @property
    def head_sha256(self) -> str:
        digest = hashlib.sha256(self.head_text.encode("utf-8"))
        digest.update(",".join(map(str, self.head_ids)).encode())
        return digest.hexdigest()

    def render(self, text: str) -> str:
        """The full prompt for one record, up to and including the JSON opener."""
        return _render(self._tokenizer, self._system, text, self.examples) + self.layout.opener

    def record_ids(self, record_id: object, text: str) -> tuple[str, list[int]]:
        """Tokenize one record's prompt; return (full prompt text, ids after the head).

        Raises:
            RecordError: the tokenizer merges the record into the head (the KV cache would not apply).
        """
        full = self.render(text)
        if not full.startswith(self.head_text) or not full.endswith(self.tail_text):
            raise RecordError(f"record {record_id!r}: the chat template rendered this text in an unexpected way")
        ids = self._tokenizer.encode(full)
        head = self.head_ids
        if tuple(ids[: len(head)]) != head:
            raise RecordError(f"record {record_id!r}: the tokenizer merges the start of the text into the prompt "
                              "head, so the cached head does not apply")
        return full, ids[len(head):]


def _render(tokenizer, system: str, text: str, examples: tuple[tuple[str, str], ...] = ()) -> str:
    messages = [{"role": "system", "content": system}]
    for example_text, answer in examples:
        messages += [{"role": "user", "content": INPUT_LABEL + example_text}, {"role": "assistant", "content": answer}]
    messages.append({"role": "user", "content": INPUT_LABEL + text})
    rendered = tokenizer.render_chat(messages)
    if rendered is None:
        shots = "".join(INPUT_LABEL + t + PLAIN_ANSWER_CUE + a + "\n\n" for t, a in examples)
        return tokenizer.bos_text + system + "\n\n" + shots + INPUT_LABEL + text + PLAIN_ANSWER_CUE
    return rendered


def common_prefix_len(a, b) -> int:
    """Length of the longest common prefix of two sequences (strings or token lists)."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def build_prompt(schema: Schema, tokenizer, layout: Layout,
                 examples: tuple[tuple[str, tuple[int, ...]], ...] = ()) -> Prompt:
    """Render the schema's prompt through the tokenizer's chat template and find the head.

    Args:
        tokenizer: backend tokenizer (``encode``, ``render_chat``, ``bos_text``).
        examples: few-shot examples as ``(input text, label index per field)``; their
            answers are written with ``answer_object`` in ``layout``.
    """
    system = system_text(schema)
    shots = tuple((text, answer_object(schema, layout, labels)) for text, labels in examples)
    a, b = _render(tokenizer, system, "x", shots), _render(tokenizer, system, "y", shots)
    cut = common_prefix_len(a, b)
    head_text = a[:cut]
    tail_len = common_prefix_len(a[::-1], b[::-1])
    tail_text = a[len(a) - tail_len:] + layout.opener
    head_ids = tokenizer.encode(head_text)
    for probe in HEAD_PROBES:
        ids = tokenizer.encode(_render(tokenizer, system, probe, shots) + layout.opener)
        n = 0
        while n < len(head_ids) and n < len(ids) and ids[n] == head_ids[n]:
            n += 1
        head_ids = head_ids[:n]
    return Prompt(head_text=head_text, head_ids=tuple(head_ids), tail_text=tail_text,
                  chat_template=tokenizer.render_chat([{"role": "user", "content": "x"}]) is not None,
                  layout=layout, _system=system, _tokenizer=tokenizer, examples=shots)
