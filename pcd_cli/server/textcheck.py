"""Checks on the text a request brings, made before anything reaches the tokenizer: pure functions
over strings and ``Schema`` values (no model, no HTTP), shared by the HTTP layer
(``wire.check_json``) and the service (``LabelService.submit``).

* **Lone surrogates** (``lone_surrogate``): JSON's ``\\ud83d`` escape can spell half of a UTF-16
  pair, which Python keeps in a ``str`` but UTF-8 (and so every tokenizer) cannot encode. One such
  text packed into a shared decode call would fail every request in it.
* **Labels that look alike** (``label_problem``): options a reader cannot tell apart on screen
  (Unicode TR39 §4, confusable detection; TR36 §3 on invisible characters; CVE-2021-42574,
  "Trojan Source", on bidi controls): a label empty once its invisible characters are removed, a
  label holding a bidi control, and two labels equal once NFKC-normalised with their invisible
  characters removed.
* **Compile cost** (``compile_cost``): the estimated label tokens of a schema, the size that
  compiling a request-built question set grows with (docs/serve.md, Limits).
"""

from __future__ import annotations

import dataclasses
import unicodedata
from typing import Iterator

from ..schema.model import Schema

#: Bidirectional controls (Unicode UAX #9): embeddings, overrides, isolates and marks. A label
#: holding one can display as another label (CVE-2021-42574).
BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def lone_surrogate(text: str) -> int | None:
    """Index of the first lone surrogate (U+D800..U+DFFF) in ``text``, or ``None`` when ``text``
    is valid Unicode (encodes as UTF-8)."""
    try:
        text.encode("utf-8")
        return None
    except UnicodeEncodeError as exc:
        return exc.start


def surrogate_message(where: str, text: str, at: int) -> str:
    """The sentence naming a lone surrogate at ``text[at]`` found in ``where``."""
    return (f"{where}: holds a lone surrogate (U+{ord(text[at]):04X} at character {at}), which is not Unicode "
            "text: a \\uD800-\\uDFFF escape must be one half of a pair; send valid UTF-8")


def strings(value: object, where: str, *, _depth: int = 0) -> Iterator[tuple[str, str]]:
    """Every string held by ``value`` (a dataclass such as ``Schema``, or tuples, lists, dicts and
    strings of them) as ``(where, text)``, ``where`` a dotted path from ``where``; dict keys
    included. Depth is bounded (32) since a schema is a few levels deep."""
    if _depth > 32:
        return
    if isinstance(value, str):
        yield where, value
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from strings(getattr(value, f.name, None), f"{where}.{f.name}", _depth=_depth + 1)
    elif isinstance(value, dict):
        for key, sub in value.items():
            if isinstance(key, str):
                yield f"{where} key", key
            yield from strings(sub, f"{where}[{key!r}]" if isinstance(key, str) and lone_surrogate(key) is None
                               else f"{where}[?]", _depth=_depth + 1)
    elif isinstance(value, (list, tuple, frozenset, set)):
        for i, sub in enumerate(value):
            yield from strings(sub, f"{where}[{i}]", _depth=_depth + 1)


def _visible(label: str) -> str:
    """``label`` NFKC-normalised, without format characters (Unicode category Cf: zero-width
    spaces and joiners, bidi controls, the BOM) and surrounding whitespace."""
    text = unicodedata.normalize("NFKC", label)
    return "".join(ch for ch in text if unicodedata.category(ch) != "Cf").strip()


def label_problem(labels: tuple[str, ...] | list[str]) -> str | None:
    """Why a field's labels cannot be told apart, or ``None``: a label with a bidi control, a
    label with no visible character, or two labels equal once NFKC-normalised without format
    characters (``"café"`` written NFC and NFD, ``"yes"`` and ``"ye\\u200bs"``)."""
    seen: dict[str, str] = {}
    for label in labels:
        if any(ch in BIDI_CONTROLS for ch in label):
            return f"label {label!r} holds a bidirectional control character, which can make it display as another"
        visible = _visible(label)
        if not visible:
            return f"label {label!r} has no visible character"
        if visible in seen:
            return (f"labels {seen[visible]!r} and {label!r} look the same (equal once Unicode-normalised, NFKC, "
                    "and stripped of invisible characters); a reader cannot tell them apart")
        seen[visible] = label
    return None


def estimate_label_tokens(label: str) -> int:
    """A label's tokens, estimated without the tokenizer: a quarter of its UTF-8 bytes plus 1
    (the same rate as ``service.estimate_tokens``)."""
    return len(label.encode("utf-8", "surrogatepass")) // 4 + 1


def compile_cost(schema: Schema) -> int:
    """The estimated label tokens of ``schema`` (the sum over its fields of every label's
    ``estimate_label_tokens``): options × tokens, the size compiling a question set grows with."""
    return sum(estimate_label_tokens(label) for f in schema.fields for label in f.labels)
