"""Model backends: the only place that imports a framework (torch, transformers, mlx).

The contract (what ``decode`` and ``bench`` rely on), implemented by ``TorchBackend`` and
``MLXBackend`` (``load_backend(model, backend=auto|torch|mlx)`` picks one, see ``select``):

``backend.tokenizer``
    ``encode(text) -> list[int]`` (no special tokens added: chat-rendered text carries its
    own), ``decode(ids) -> str``, ``render_chat(messages) -> str | None`` (the model's own
    chat template with ``add_generation_prompt=True``, ``enable_thinking=False`` and a pinned
    ``date_string``; ``None`` when the tokenizer has no template), ``vocab_size`` (ids below
    it are real tokens), ``bos_text`` (text to put first in a plain-text prompt, or '').
    Optional, for ``inspect-schema``'s template probe: ``chat_args`` (the arguments
    ``render_chat`` passes), ``chat_template`` (its source), ``render_chat(messages,
    **overrides)``.
``backend.model_id``, ``backend.logits_width``
    A name for metadata; the width of the logits (may exceed ``vocab_size``: padded columns
    are ignored when normalising).
``prefill(ids)``
    Reset the KV cache and fill it with ``ids`` (the prompt head). One forward pass.
``forward(ids, positions, visible, keep_rows, gather_ids) -> ndarray``
    One forward pass of ``q`` new tokens on top of the cache. ``ids``, ``positions``: int
    arrays ``(q,)``; ``positions`` are RoPE positions, free per token. ``visible``: bool
    ``(q, cache_len + q)``, ``visible[i, j]`` = new token ``i`` attends to key ``j``
    (cache first, then the new tokens). ``keep_rows``: int ``(r,)`` rows whose next-token
    distribution is needed; ``gather_ids``: int ``(r, m)`` token ids to read at each kept
    row, ``-1`` for padding. Returns float64 ``(r, m)`` natural-log probabilities
    (log-softmax over the first ``vocab_size`` logits), ``-inf`` at padding. The new tokens'
    KV stays in the cache.
``truncate(length)``
    Drop cache entries beyond ``length`` (back to the head after a group of records).
``full_logprobs(ids, rows=None) -> ndarray``
    Plain forward over ``ids`` with no cache: float64 ``(len(rows), vocab_size)`` log-probs
    of the next token after each position in ``rows`` (all positions when ``None``); the
    brute-force oracle uses it.
``generate(ids, max_new_tokens, cache_prefix_len=0) -> (new_ids, forward_passes)``
    Greedy token-by-token generation (the benchmark's baseline); ``cache_prefix_len`` > 0
    reuses the KV of ``ids[:cache_prefix_len]`` computed once and kept between calls.
``max_positions``
    The model's context length in tokens (``None`` if unknown); longer records are cut or
    refused (``Decoder.truncate``).
``eos_token_ids``
    Token ids that end generation.
``forward_passes``
    Count of model forward calls made so far (measured, never assumed).
"""

from .select import load_backend

__all__ = ["TorchBackend", "MLXBackend", "load_backend"]


def __getattr__(name):  # the backends import their framework only when asked for
    if name == "TorchBackend":
        from .torch_backend import TorchBackend
        return TorchBackend
    if name == "MLXBackend":
        from .mlx_backend import MLXBackend
        return MLXBackend
    raise AttributeError(name)
