"""Model backends: the only place that imports a framework (torch, transformers, mlx).

The contract (what ``decode``, ``bench``, ``oracle`` and the conformance suite rely on) is
written here once and typed as ``typing.Protocol`` classes in ``backends/base.py``
(``Backend``, ``Tokenizer``); ``TorchBackend`` and ``MLXBackend``
implement it (``load_backend(model, backend=auto|torch|mlx)`` picks one, see ``select``). A
backend holds **no per-caller state**: each caller owns its KV caches (``KVHandle``), so
several ``Labeler`` objects can share one loaded model and interleave their passes.

``backend.tokenizer``
    ``encode(text) -> list[int]`` (no special tokens added: chat-rendered text carries its
    own), ``decode(ids) -> str``, ``render_chat(messages) -> str | None`` (the model's own
    chat template with ``add_generation_prompt=True``, ``enable_thinking=False`` and a pinned
    ``date_string``; exactly the turns given, no merging; ``None`` when the tokenizer has no
    template; raises ``ValueError`` when the template refuses the turns, e.g. a system
    role), ``vocab_size`` (ids below it are real tokens), ``bos_text`` (text to put first in
    a plain-text prompt, or '').
    Untrusted record text (``pcd_cli.decoding.seams``): ``encode_text(text, *, at_start=True) ->
    list[int]`` tokenizes ``text`` as plain text, special-token strings in it becoming
    ordinary text tokens (transformers: ``split_special_tokens=True``); ``at_start=False``
    tokenizes it as a piece that follows a special token inside a longer text (no
    start-of-text ``▁`` from a Metaspace ``prepend_scheme="first"``).
    ``special_ids -> frozenset[int]`` (ids of the special/control tokens) and
    ``special_texts -> tuple[str, ...]`` (their strings, longest first).
    Optional, for ``inspect-schema``'s template probe: ``chat_args`` (the arguments
    ``render_chat`` passes), ``chat_template`` (its source), ``render_chat(messages,
    **overrides)``.
``backend.kind``
    Its ``--backend`` name (``torch``, ``mlx``): ``select.KINDS`` says what each kind takes
    (adapters) and which library versions fingerprint its runs (``library_versions``); nothing
    outside ``backends/`` tests a backend's class.
``backend.model_id``, ``backend.device``, ``backend.dtype_name``, ``backend.logits_width``
    A name for metadata; the device; the weights' dtype as a string (``"float32"``...); the
    width of the logits (may exceed ``vocab_size``: padded columns are ignored when
    normalising).
``rope_variant(n_positions) -> Hashable``
    Which RoPE frequency set a plain forward over a text of ``n_positions`` tokens uses
    (long-context RoPE such as ``longrope`` switches sets with the length); a constant (``0``)
    for models whose RoPE does not depend on the length. Records whose variants differ are
    never packed into one pass, and each variant has its own head cache.
``prefill(ids, *, variant=0) -> KVHandle``
    A new KV cache filled with ``ids`` (the prompt head), computed with RoPE ``variant``.
    One forward pass. The caller owns the handle.
``forward(cache, ids, positions, visible, keep_rows, gather_ids) -> ndarray``
    One forward pass of ``q`` new tokens on top of ``cache`` (with the cache's RoPE
    variant). ``ids``, ``positions``: int arrays ``(q,)``; ``positions`` are RoPE positions,
    free per token (tree positions). ``visible``: bool ``(q, cache_length(cache) + q)``,
    ``visible[i, j]`` = new token ``i`` attends to key ``j`` (cache first, then the new
    tokens). Sliding-window layers further hide keys whose position is ``window`` or more
    before the query's position (the backend applies that, from the positions). ``keep_rows``:
    int ``(r,)`` rows whose next-token distribution is needed; ``gather_ids``: int ``(r, m)``
    token ids to read at each kept row, ``-1`` for padding. Returns float64 ``(r, m)``
    natural-log probabilities (log-softmax over the first ``vocab_size`` logits, computed in
    float32 at least and upcast on the CPU), ``-inf`` at padding; a row with a NaN or ``+inf``
    logit (half-precision overflow) is all NaN, and the decoder fails its record. The new tokens' KV stays in the cache.
``forward_features(cache, ids, positions, visible, keep_rows, gather_ids, feature_rows, layers)``
    Optional (the linear readout, ``pcd calibrate --readout linear``): ``forward`` and, in the
    same pass, the hidden states of ``layers`` (1-based, up to ``n_layers``; layer ``l`` is
    transformers' ``hidden_states[l]``: decoder layer ``l``'s output, the last after the final
    norm) at the new tokens ``feature_rows``, float64 ``(len(feature_rows), len(layers),
    hidden_size)``; only those rows of those layers are kept. ``full_hidden(ids, rows, layers)``
    is its oracle: a plain forward over ``ids`` without a cache.
``truncate(cache, length)``
    Drop the cache's entries beyond ``length`` (back to the head after a group of records).
``cache_length(cache) -> int``
    Number of entries (tokens) in the cache.
``full_logprobs(ids, rows=None) -> ndarray``
    Plain forward over ``ids`` with no cache: float64 ``(len(rows), vocab_size)`` log-probs
    of the next token after each position in ``rows`` (all positions when ``None``).
``generate(ids, max_new_tokens, cache_prefix_len=0) -> (new_ids, forward_passes)``
    Greedy token-by-token generation (the benchmark's baseline); ``cache_prefix_len`` > 0
    reuses the KV of ``ids[:cache_prefix_len]`` computed once (a memo keyed by those ids).
``max_positions``
    The model's context length in tokens (``None`` if unknown); longer records are cut or
    refused (``Decoder.truncate``).
``eos_token_ids``
    Token ids that end generation.
``forward_passes``
    Count of model forward calls made so far (measured, never assumed).

``pcd_cli.backends.conformance`` checks any backend against an independent oracle (eager
attention, full forward, no cache) on tiny random models of every supported family.
"""

from .base import Backend, KVHandle, Tokenizer
from .select import KINDS, kind_of, library_versions, load_backend, takes_adapters

__all__ = ["Backend", "KVHandle", "Tokenizer", "TorchBackend", "MLXBackend", "KINDS", "kind_of", "library_versions",
           "load_backend", "takes_adapters"]


def __getattr__(name):  # the backends import their framework only when asked for
    if name == "TorchBackend":
        from .torch_backend import TorchBackend
        return TorchBackend
    if name == "MLXBackend":
        from .mlx_backend import MLXBackend
        return MLXBackend
    raise AttributeError(name)
