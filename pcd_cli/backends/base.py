"""The backend contract as ``typing.Protocol`` classes (the package docstring explains it).

``decode``, ``bench``, ``oracle`` and the conformance suite use a backend only through these
members; ``TorchBackend`` and the MLX backend implement them. Nothing here imports a
framework.
"""

from __future__ import annotations

from typing import Any, Hashable, Protocol, Sequence, runtime_checkable

import numpy as np

#: An opaque per-caller KV cache made by ``Backend.prefill``: the caller owns it, passes it
#: back to ``forward``/``truncate``/``cache_length``, and two callers never share one. Its
#: type is the backend's own (``TorchKV`` for torch).
KVHandle = Any


@runtime_checkable
class Tokenizer(Protocol):
    """The tokenizer side of the contract (see the package docstring)."""

    vocab_size: int
    bos_text: str

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def render_chat(self, messages: list[dict], **overrides) -> str | None: ...


@runtime_checkable
class Backend(Protocol):
    """A causal LM that scores token forests on top of a caller-owned KV cache.

    The backend itself holds no per-caller state: every cache is a ``KVHandle`` returned by
    ``prefill`` and owned by its caller (one per ``Decoder``), so several ``Labeler``
    objects may share one backend and interleave their calls.
    """

    tokenizer: Tokenizer
    model_id: str
    #: ``"cpu"``, ``"cuda"``, ``"mps"``, ... (for metadata and benchmark reports).
    device: Any
    #: Name of the weights' dtype, e.g. ``"float32"`` (error messages, fingerprints).
    dtype_name: str
    logits_width: int
    max_positions: int | None
    eos_token_ids: tuple[int, ...]
    forward_passes: int

    def rope_variant(self, n_positions: int) -> Hashable: ...

    def prefill(self, ids: Sequence[int], *, variant: Hashable = 0) -> KVHandle: ...

    def forward(self, cache: KVHandle, ids: np.ndarray, positions: np.ndarray, visible: np.ndarray,
                keep_rows: np.ndarray, gather_ids: np.ndarray) -> np.ndarray: ...

    def truncate(self, cache: KVHandle, length: int) -> None: ...

    def cache_length(self, cache: KVHandle) -> int: ...

    def full_logprobs(self, ids: Sequence[int], rows: Sequence[int] | None = None) -> np.ndarray: ...

    def generate(self, ids: Sequence[int], max_new_tokens: int, cache_prefix_len: int = 0
                 ) -> tuple[list[int], int]: ...
