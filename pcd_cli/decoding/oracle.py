"""Brute-force reference for the decoder: plain forward passes over full texts, no cache.

For one field after a given context text (docs/how-it-works.md, "The correctness oracle"; issue #2's
exact-mode definition): every spelling's complete line is appended to the context and the
whole text is tokenized at once; the trunk is the longest token prefix common to all
spellings; a spelling's path is its tokens after the trunk — to the end of the line
(``exact``) or up to the first token after which only one label shares the prefix
(``marginal``). A path's probability is the product of the conditional probabilities of
its tokens, each read from a plain forward pass over that full text. It shares no code
with ``compile`` or ``decode`` beyond the schema and the layout's line text.
"""

from __future__ import annotations

import numpy as np

from ..schema.model import Field
from .prompt import common_prefix_len


def oracle_field(backend, context: str, field: Field, lines: list[tuple[int, str]], scoring: str
                 ) -> tuple[np.ndarray, float]:
    """Label probabilities and candidate mass of ``field`` after ``context``, by brute force.

    Args:
        backend: any backend (uses ``tokenizer.encode`` and ``full_logprobs``).
        context: the exact text preceding the field's line (the trace's ``context``).
        lines: ``(label index, complete line text)`` for every spelling.
        scoring: ``"marginal"`` or ``"exact"``.

    Returns:
        ``(probs, mass)``: float64 ``(len(field.labels),)`` and the candidate mass.
    """
    label_lp = oracle_label_logprobs(backend, context, field, lines, scoring)
    log_mass = np.logaddexp.reduce(label_lp)
    return np.exp(label_lp - log_mass), float(np.exp(log_mass))


def oracle_label_logprobs(backend, context: str, field: Field, lines: list[tuple[int, str]], scoring: str,
                          labels: set[int] | None = None) -> np.ndarray:
    """Unnormalised log-probability of each label's paths after ``context`` (natural log).

    One plain forward pass per path of the labels asked for (all when ``labels`` is
    ``None``); the trunk is still found from every spelling, so a label's value is the same
    whichever subset is asked. ``exp`` of an entry is ``probs[label] * mass`` of
    ``oracle_field``.

    Returns:
        float64 ``(len(field.labels),)``; ``-inf`` for labels not asked for.
    """
    encode = backend.tokenizer.encode
    seqs = [(label, tuple(encode(context + line))) for label, line in lines]
    first = seqs[0][1]
    trunk = min(min(common_prefix_len(first, s) for _, s in seqs[1:]), min(len(s) for _, s in seqs) - 1)
    paths: dict[tuple[int, ...], int] = {}
    for label, seq in seqs:
        end = len(seq)
        if scoring == "marginal":
            for j in range(trunk + 1, len(seq) + 1):
                owners = {lab for lab, other in seqs if other[:j] == seq[:j]}
                if owners == {label}:
                    end = j
                    break
        paths[seq[:end]] = label
    label_lp = np.full(len(field.labels), -np.inf)
    for prefix, label in paths.items():
        if labels is not None and label not in labels:
            continue
        rows = list(range(trunk - 1, len(prefix) - 1))
        logprobs = backend.full_logprobs(prefix, rows)
        lp = sum(logprobs[j, prefix[row + 1]] for j, row in enumerate(rows))
        label_lp[label] = np.logaddexp(label_lp[label], lp)
    return label_lp


def oracle_decision_features(backend, context: str, lines: list[tuple[int, str]], layers) -> np.ndarray:
    """The hidden states a field's decision point holds, by brute force: a plain forward over
    ``context`` + the field's line up to its trunk's last token (the trie's root, whose
    next-token distribution the first decision reads), no cache (``backend.full_hidden``).

    Args:
        context: the exact text preceding the field's line (the trace's ``context``).
        lines: ``(label index, complete line text)`` for every spelling.
        layers: 1-based layers (``Backend.forward_features``).

    Returns:
        float64 ``(len(layers), hidden_size)``.
    """
    encode = backend.tokenizer.encode
    seqs = [tuple(encode(context + line)) for _, line in lines]
    trunk = min(min((common_prefix_len(seqs[0], s) for s in seqs[1:]), default=len(seqs[0])),
                min(len(s) for s in seqs) - 1)
    return backend.full_hidden(seqs[0][:trunk], [trunk - 1], list(layers))[0]


def oracle_pooled_features(backend, compiled, record_id: object, text: str, layers) -> np.ndarray:
    """The record-mean features (``Decoder.feature_layers`` ``-l``) by brute force: a plain
    forward over the record's complete prompt (``compiled.record_chain``'s text, tokenized whole,
    no cache; ``backend.full_hidden``), averaged over the tokens after the head up to the first
    wave's forests (the record's wave-0 chain).

    Args:
        layers: 1-based layers (positive: the mean of layer ``l``).

    Returns:
        float64 ``(len(layers), hidden_size)``.

    Raises:
        AssertionError: the whole prompt's tokens do not start with the head and the chain the
            decoder feeds (a seam the decoder should have refused).
    """
    full, chain = compiled.record_chain(record_id, text)
    head = list(compiled.prompt.head_ids)
    ids = list(backend.tokenizer.encode(full))
    assert ids[: len(head) + len(chain)] == head + list(chain), "the prompt does not tokenize as head + chain"
    rows = list(range(len(head), len(head) + len(chain)))
    return backend.full_hidden(ids[: len(head) + len(chain)], rows, list(layers)).mean(axis=0)
