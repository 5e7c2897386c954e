"""MLX backend through mlx-lm (Apple silicon GPU or CPU). See the package docstring for the contract.

mlx-lm's model files are reused as they are (their modules and weights); three thin
wrappers make them take a token forest (docs/how-it-works.md, "One pass per wave: the token forest"):

* ``_ForestKV`` stands in for mlx-lm's per-layer KV cache. Its ``update_and_fetch``
  appends the new keys/values (new arrays each pass, so a prefix shared between callers is
  never written to; every layer keeps every key); its ``offset`` is the per-token RoPE
  positions of the pass, an int array ``(q,)``.
* ``_LayerMask`` wraps each layer's attention and hands it, on forest passes, the boolean
  visibility mask over cache + new tokens, AND for a sliding-window layer the window
  ``q_pos - k_pos < window`` on RoPE positions. Which layers slide, and how far, comes
  from the transformers config (``torch_arch.attention_layout``), the same layout the
  torch backend uses, so mlx-lm files that ignore a window (qwen2, mistral) still score
  exactly.
* ``_TokenRoPE`` wraps each attention layer's own RoPE module (any of mlx-lm's scaling
  variants). mlx-lm's attention applies RoPE with one offset per sequence; given a
  positions array it rotates each token as its own batch row (``mx.fast.rope`` takes one
  offset per batch row), so every token gets its own position. With an int offset (plain
  mlx-lm calls, e.g. ``full_logprobs`` and ``generate``) it is the wrapped module unchanged.
* ``_KeepRows`` wraps the final norm and keeps only the rows whose next-token
  distribution is needed, so only those go through the LM head (and whatever the model
  does after it).

``full_logprobs`` and ``generate`` run mlx-lm's own code path (its causal mask, its RoPE
offset, its KV cache): the oracle then checks the forest path against code it shares
nothing with beyond the weights (for sliding-window models whose mlx-lm file ignores the
window, check against ``conformance.EagerOracle`` instead, as tests/backends/test_mlx.py does).
"""

from __future__ import annotations

import copy
import json
import warnings
from pathlib import Path
from typing import Hashable, Sequence

import mlx.core as mx
import mlx.nn as nn
import mlx_lm
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from ..errors import ModelError
from .tokenizer import HFTokenizer

DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}
#: mlx-lm ``model_type`` values whose attention layers take ``(x, mask, cache)`` and read RoPE
#: through ``self.rope(x, offset=cache.offset)``; each is checked by tests/backends/test_mlx.py.
SUPPORTED_TYPES = ("llama", "qwen2", "qwen3", "gemma3", "gemma3_text", "mistral")


#: Columns summed together before the block sums are added (``log_softmax``).
SUM_BLOCK = 256


def log_softmax(logits: mx.array) -> mx.array:
    """Log-softmax over the last axis of float32 ``(rows, vocab)`` logits, accurate to float32.

    MLX's CPU ``sum``/``logsumexp`` add a row's terms one after another, so over a 49,152-token
    vocabulary the rounding error of the total grows to ~1e-4 in log space (measured on
    SmolLM2-135M: 2.6e-4 against a float64 forward, torch's ``log_softmax`` 6.9e-5). Summing
    ``SUM_BLOCK`` columns at a time and then the block sums (a two-level pairwise sum, Higham,
    *Accuracy and Stability of Numerical Algorithms*, §4.2) brings it to ~1e-6 like torch.
    """
    peak = mx.max(logits, axis=-1, keepdims=True)
    shifted = logits - peak
    terms = mx.exp(shifted)
    rows, width = terms.shape
    pad = -width % SUM_BLOCK
    if pad:
        terms = mx.pad(terms, [(0, 0), (0, pad)])
    total = terms.reshape(rows, -1, SUM_BLOCK).sum(axis=-1).sum(axis=-1, keepdims=True)
    return shifted - mx.log(total)


class _PassState:
    """What the current pass tells every layer: RoPE positions and the visibility mask."""

    def __init__(self):
        self.positions: mx.array | None = None  # (q,) int32
        self.key_positions: mx.array | None = None  # (k,) int32: cache + new tokens
        self.visible: mx.array | None = None  # (q, k) bool
        self._windowed: dict[int, mx.array] = {}

    def set(self, positions: mx.array, key_positions: mx.array, visible: mx.array) -> None:
        self.positions, self.key_positions, self.visible = positions, key_positions, visible
        self._windowed = {}

    def mask(self, window_size: int | None) -> mx.array:
        """``(1, 1, q, k)`` bool; a sliding-window layer also hides keys ``window_size`` or
        more positions behind the query (mlx-lm's own rule, ``q - k < window``, on positions)."""
        if window_size is None:
            return self.visible[None, None]
        if window_size not in self._windowed:
            near = (self.positions[:, None] - self.key_positions[None, :]) < window_size
            self._windowed[window_size] = (self.visible & near)[None, None]
        return self._windowed[window_size]


class _ForestKV:
    """One layer's KV cache for forest passes (stands in for mlx-lm's ``KVCache``).

    ``keys``/``values``: ``(1, kv_heads, length, head_dim)`` or ``None`` when empty.
    """

    def __init__(self, state: _PassState, keys=None, values=None):
        self.state = state
        self.keys = keys
        self.values = values

    @property
    def offset(self) -> mx.array:
        return self.state.positions

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        if self.keys is not None:
            keys = mx.concatenate([self.keys, keys], axis=2)
            values = mx.concatenate([self.values, values], axis=2)
        self.keys, self.values = keys, values
        return keys, values

    def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None) -> mx.array:
        return self.state.mask(window_size)

    def __len__(self) -> int:  # mlx-lm tests caches for truth with `if cache`
        return 0 if self.keys is None else int(self.keys.shape[2])

    def __bool__(self) -> bool:
        return True


class _TokenRoPE(nn.Module):
    """A layer's RoPE module, taught per-token positions (see the module docstring)."""

    def __init__(self, rope):
        super().__init__()
        self.inner = rope

    def __call__(self, x: mx.array, offset=0) -> mx.array:
        if isinstance(offset, mx.array) and offset.ndim == 1 and x.shape[0] == 1 and offset.size == x.shape[-2]:
            # (1, heads, q, d) -> (q, heads, 1, d): one batch row, one offset, per token.
            return self.inner(x.swapaxes(0, 2), offset=offset).swapaxes(0, 2)
        return self.inner(x, offset=offset)


class _LayerMask(nn.Module):
    """A layer's attention module, handed its own mask on forest passes: the visibility mask,
    and for a sliding-window layer (``window`` set) only keys less than ``window`` positions
    before the query (the window of the transformers config, applied per layer whatever
    mlx-lm's own model file does with it). Plain mlx-lm calls pass through unchanged."""

    def __init__(self, attn, window: int | None):
        super().__init__()
        self.inner = attn
        self.window = window

    def __call__(self, x: mx.array, mask=None, cache=None, **kwargs) -> mx.array:
        if isinstance(cache, _ForestKV):
            mask = cache.state.mask(self.window)
        return self.inner(x, mask, cache, **kwargs)


class _KeepRows(nn.Module):
    """The final norm, then only the rows in ``rows`` (all when ``None``); with ``tap_rows`` set,
    the normed hidden state at those rows is kept in ``tapped`` (``forward_features``' last layer)."""

    def __init__(self, norm):
        super().__init__()
        self.inner = norm
        self.rows: mx.array | None = None
        self.tap_rows: mx.array | None = None
        self.tapped: mx.array | None = None

    def __call__(self, h: mx.array) -> mx.array:
        h = self.inner(h)
        if self.tap_rows is not None:
            self.tapped = h[0, self.tap_rows]
        return h if self.rows is None else h[:, self.rows]


class _Tap(nn.Module):
    """A decoder layer whose output at ``tap_rows`` (when set) is kept in ``tapped``
    (``MLXBackend.forward_features``); calls pass through unchanged."""

    def __init__(self, layer):
        super().__init__()
        self.inner = layer
        self.tap_rows: mx.array | None = None
        self.tapped: mx.array | None = None

    def __getattr__(self, name):  # mlx-lm model files read layer attributes (e.g. use_sliding)
        try:
            return super().__getattr__(name)
        except AttributeError:
            inner = self.get("inner")  # the module's own dict: no recursion while it is being built or copied
            if inner is None:
                raise
            return getattr(inner, name)

    def __call__(self, *args, **kwargs):
        out = self.inner(*args, **kwargs)
        if self.tap_rows is not None:
            hidden = out[0] if isinstance(out, tuple) else out
            self.tapped = hidden[0, self.tap_rows]
        return out


class KVState:
    """A caller-owned KV cache (the contract's ``KVHandle``) for ``MLXBackend``: one
    ``_ForestKV`` per layer (every layer keeps every key; sliding windows are applied by the
    mask) plus the keys' RoPE positions ``(length,)``, and the RoPE variant.

    Copies share the arrays (passes never write into them), so a cached head can be reused
    by several callers at the cost of a list copy.
    """

    def __init__(self, n_layers: int, variant: Hashable = 0):
        self.variant = variant
        self.pass_state = _PassState()
        self.layers = [_ForestKV(self.pass_state) for _ in range(n_layers)]
        self.key_positions = mx.zeros((0,), dtype=mx.int32)

    def __len__(self) -> int:
        return int(self.key_positions.shape[0])

    def copy(self) -> "KVState":
        other = KVState(len(self.layers), self.variant)
        other.key_positions = self.key_positions
        for mine, theirs in zip(self.layers, other.layers):
            theirs.keys, theirs.values = mine.keys, mine.values
        return other

    def crop(self, length: int) -> None:
        if length < len(self):
            self.key_positions = self.key_positions[:length]
            for layer in self.layers:
                layer.keys = layer.keys[:, :, :length]
                layer.values = layer.values[:, :, :length]

    def arrays(self) -> list[mx.array]:
        return [self.key_positions] + [a for layer in self.layers if layer.keys is not None
                                       for a in (layer.keys, layer.values)]


def _language_model(model):
    """The module holding ``model.layers``-style ``layers`` and the final ``norm``."""
    lm = getattr(model, "language_model", model)  # gemma3 wraps its text model
    inner = getattr(lm, "model", None)
    if inner is None or not hasattr(inner, "norm") or not hasattr(inner, "layers"):
        raise ModelError(f"the MLX backend cannot find the decoder layers of a {type(model).__module__} model")
    return inner


class MLXBackend:
    """A causal LM in MLX; implements ``pcd_cli.backends.base.Backend``.

    It holds no per-caller state: KV caches are ``KVState`` handles owned by callers.

    Args:
        model: an mlx-lm model (``mlx_lm.load(...)[0]``), weights in their final dtype.
        tokenizer: the matching Hugging Face tokenizer.
        model_id: name recorded in output metadata.
        device: ``mx.cpu`` or ``mx.gpu``; every computation runs on its default stream.
        eos_token_ids: token ids that end generation.

    Raises:
        ModelError: the architecture is not one whose attention layers this backend can
            drive (see ``SUPPORTED_TYPES``).
    """

    #: its ``--backend`` name (``pcd_cli.backends.select.KINDS``)
    kind = "mlx"

    @property
    def content_key(self) -> str:
        """SHA-256 (hex) naming the weights this backend runs, as ``TorchBackend.content_key``:
        ``model_content_key`` of the ``--model`` it was loaded from (``load_backend`` sets
        ``content_source``), else the SHA-256 over its parameters' names, dtypes, shapes and
        bytes. Taken once per backend (``pcd_cli.job_fingerprint``, the ``model`` part)."""
        key = getattr(self, "_content_key", None)
        if key is None:
            from .torch_backend import model_content_key

            source = getattr(self, "content_source", None)
            key = model_content_key(source[0]) if source is not None else None
            if key is None or key.startswith("id:"):
                import hashlib

                import numpy as np
                from mlx.utils import tree_flatten

                digest = hashlib.sha256()
                for name, value in sorted(tree_flatten(self.model.parameters()), key=lambda kv: kv[0]):
                    digest.update(f"{name}:{value.dtype}:{tuple(value.shape)}".encode())
                    digest.update(np.asarray(value.astype(mx.float32) if value.dtype == mx.bfloat16 else value)
                                  .tobytes())
                key = digest.hexdigest()
            self._content_key = key
        return key

    def __init__(self, model, tokenizer, model_id: str, *, device=None, eos_token_ids: Sequence[int] = (),
                 windows: Sequence[int | None] | None = None):
        model_type = getattr(model, "model_type", None) or getattr(getattr(model, "args", None), "model_type", "")
        if model_type not in SUPPORTED_TYPES:
            raise ModelError(f"--backend mlx: architecture {model_type!r} is not supported (supported: "
                             f"{', '.join(SUPPORTED_TYPES)}); use --backend torch")
        self.model = model
        self.model_type = model_type
        self.tokenizer = HFTokenizer(tokenizer)
        self.model_id = model_id
        self.mx_device = device if device is not None else mx.default_device()
        self.device = f"mlx:{'gpu' if self.mx_device == mx.gpu else 'cpu'}"
        inner = _language_model(model)
        self._layers = list(inner.layers)
        windows = list(windows) if windows is not None else [None] * len(self._layers)
        if len(windows) != len(self._layers):
            raise ModelError(f"--backend mlx: the config lists {len(windows)} layer types for "
                             f"{len(self._layers)} layers")
        for layer, window in zip(self._layers, windows):
            attn = getattr(layer, "self_attn", None)
            if isinstance(attn, _LayerMask):
                attn = attn.inner
            if attn is None or not hasattr(attn, "rope"):
                raise ModelError(f"--backend mlx: {model_type!r} layers have no self_attn.rope to drive")
            if not isinstance(attn.rope, _TokenRoPE):
                attn.rope = _TokenRoPE(attn.rope)
            layer.self_attn = _LayerMask(attn, window)
        if not isinstance(inner.norm, _KeepRows):
            inner.norm = _KeepRows(inner.norm)
        self._keep = inner.norm
        for i in range(len(inner.layers) - 1):
            if not isinstance(inner.layers[i], _Tap):
                inner.layers[i] = _Tap(inner.layers[i])
        #: ``forward_features``' layers 1..n_layers: decoder layer ``l``'s output, the last
        #: one after the final norm (transformers' ``hidden_states[l]``)
        self._taps = [*inner.layers[:-1], self._keep]
        self.n_layers = len(self._taps)
        embed = inner.embed_tokens
        self.dtype_name = str(embed.scales.dtype if hasattr(embed, "scales") else embed.weight.dtype).split(".")[-1]
        with mx.stream(self.mx_device):
            probe = model(mx.array([[0]]))
            self.logits_width = int(probe.shape[-1])
        args = getattr(model, "args", None)
        text_args = getattr(getattr(model, "language_model", None), "args", None) or args
        self.max_positions = getattr(text_args, "max_position_embeddings", None)
        self.eos_token_ids = tuple(sorted(eos_token_ids))
        self.forward_passes = 0
        self._gen_prefix: tuple | None = None

    # -- the model call every method goes through (counts passes) -----------------------
    def _call(self, ids: mx.array, cache, rows: Sequence[int] | np.ndarray | None) -> mx.array:
        """One forward pass of ``ids`` ``(1, q)``; logits ``(len(rows), logits_width)``."""
        self._keep.rows = None if rows is None else mx.array(np.asarray(rows, dtype=np.int32))
        try:
            logits = self.model(ids, cache=cache)
        finally:
            self._keep.rows = None
        self.forward_passes += 1
        return logits[0]

    def _logprobs(self, logits: mx.array) -> mx.array:
        """float32 log-softmax over the first ``vocab_size`` columns (``log_softmax``)."""
        return log_softmax(logits[:, : self.tokenizer.vocab_size].astype(mx.float32))

    # -- the backend contract (pcd_cli.backends.base.Backend) -------------------------------
    def rope_variant(self, n_positions: int) -> Hashable:
        """0: mlx-lm's RoPE modules here do not switch frequency sets with the text's length."""
        return 0

    def cache_length(self, cache: KVState) -> int:
        return len(cache)

    def prefill(self, ids: Sequence[int], *, variant: Hashable = 0) -> KVState:
        """A new caller-owned KV cache holding ``ids`` (positions ``0..n-1``, causal). One pass."""
        cache = KVState(len(self._layers), variant)
        n = len(ids)
        if n:
            self.forward(cache, np.asarray(ids), np.arange(n), np.tril(np.ones((n, n), dtype=bool)),
                         np.array([n - 1]), np.full((1, 1), -1))
        return cache

    def truncate(self, cache: KVState, length: int) -> None:
        cache.crop(length)

    def forward(self, cache: KVState, ids: np.ndarray, positions: np.ndarray, visible: np.ndarray,
                keep_rows: np.ndarray, gather_ids: np.ndarray) -> np.ndarray:
        """One pass of ``q`` new tokens on ``cache`` (see the package docstring); their KV joins it."""
        q = len(ids)
        if visible.shape != (q, len(cache) + q):
            raise ValueError(f"visible has shape {visible.shape}, expected {(q, len(cache) + q)}")
        gather_ids = np.asarray(gather_ids, dtype=np.int64)
        with mx.stream(self.mx_device):
            pos = mx.array(np.asarray(positions, dtype=np.int32))
            key_positions = mx.concatenate([cache.key_positions, pos])
            cache.pass_state.set(pos, key_positions, mx.array(np.asarray(visible, dtype=bool)))
            try:
                logits = self._call(mx.array(np.asarray(ids, dtype=np.int32))[None], cache.layers, keep_rows)
            finally:
                cache.pass_state.set(None, None, None)
            cache.key_positions = key_positions
            picked = mx.take_along_axis(self._logprobs(logits),
                                        mx.array(np.maximum(gather_ids, 0).astype(np.int32)), axis=1)
            real = logits[:, : self.tokenizer.vocab_size]
            bad = mx.any(mx.logical_or(mx.isnan(real), mx.isposinf(real)), axis=-1)
            mx.eval(picked, bad, *cache.arrays())  # a pass boundary: nothing lazy outlives it
        out = np.array(picked).astype(np.float64)
        out[gather_ids < 0] = -np.inf
        out[np.array(bad)] = np.nan  # a NaN/+inf logit (half-precision overflow): the contract's NaN row
        return out

    def forward_features(self, cache: KVState, ids: np.ndarray, positions: np.ndarray, visible: np.ndarray,
                         keep_rows: np.ndarray, gather_ids: np.ndarray, feature_rows: np.ndarray,
                         layers: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """``forward``, and in the same pass the hidden states of ``layers`` (1-based, as
        ``TorchBackend.forward_features``) at ``feature_rows``: only those rows of those layers
        are kept. Returns ``(logprobs, features)``, features float64
        ``(len(feature_rows), len(layers), hidden_size)``.

        Raises:
            ValueError: a layer outside ``1..n_layers``.
        """
        bad = [l for l in layers if not 1 <= l <= self.n_layers]
        if bad:
            raise ValueError(f"layer {bad[0]} is outside 1..{self.n_layers}")
        rows = mx.array(np.asarray(feature_rows, dtype=np.int32))
        taps = {layer: self._taps[layer - 1] for layer in layers}
        for tap in taps.values():
            tap.tap_rows = rows
        try:
            lp = self.forward(cache, ids, positions, visible, keep_rows, gather_ids)
            with mx.stream(self.mx_device):
                got = [taps[layer].tapped.astype(mx.float32) for layer in layers]
                mx.eval(*got)
        finally:
            for tap in taps.values():
                tap.tap_rows = tap.tapped = None
        features = np.stack([np.array(g) for g in got], axis=1).astype(np.float64) if got else \
            np.zeros((len(feature_rows), 0, 0))
        return lp, features

    def full_hidden(self, ids: Sequence[int], rows: Sequence[int], layers: Sequence[int]) -> np.ndarray:
        """mlx-lm's own forward over ``ids`` (no cache): float64 ``(len(rows), len(layers),
        hidden_size)`` hidden states at ``rows`` (the oracle of ``forward_features``)."""
        taps = {layer: self._taps[layer - 1] for layer in layers}
        for tap in taps.values():
            tap.tap_rows = mx.array(np.asarray(list(rows), dtype=np.int32))
        try:
            with mx.stream(self.mx_device):
                mx.eval(self._call(mx.array([list(ids)], dtype=mx.int32), None, [len(ids) - 1]))
                got = [np.array(taps[layer].tapped.astype(mx.float32)) for layer in layers]
        finally:
            for tap in taps.values():
                tap.tap_rows = tap.tapped = None
        return np.stack(got, axis=1).astype(np.float64)

    def full_logprobs(self, ids: Sequence[int], rows: Sequence[int] | None = None) -> np.ndarray:
        """mlx-lm's own forward (its causal mask and RoPE, no cache): float64 ``(rows, vocab_size)``."""
        with mx.stream(self.mx_device):
            logits = self._call(mx.array([list(ids)], dtype=mx.int32), None,
                                list(rows) if rows is not None else None)
            lp = self._logprobs(logits)
            mx.eval(lp)
        return np.array(lp, dtype=np.float64)

    def generate(self, ids: Sequence[int], max_new_tokens: int, cache_prefix_len: int = 0) -> tuple[list[int], int]:
        """Greedy generation on mlx-lm's own KV cache; returns (new token ids, forward passes).

        One pass over the prompt (after a cached prefix), then one per further token, like
        transformers ``generate``. ``cache_prefix_len`` > 0 reuses the KV of
        ``ids[:cache_prefix_len]``, computed once and deep-copied per call.
        """
        ids = list(ids)
        with mx.stream(self.mx_device):
            before = self.forward_passes
            if cache_prefix_len:
                key = tuple(ids[:cache_prefix_len])
                if self._gen_prefix is None or self._gen_prefix[0] != key:
                    prefix_cache = make_prompt_cache(self.model)
                    mx.eval(self._call(mx.array([list(key)], dtype=mx.int32), prefix_cache, [len(key) - 1]))
                    mx.eval([c.state for c in prefix_cache])
                    self._gen_prefix = (key, prefix_cache)
                    before = self.forward_passes  # the shared prefix is paid once, not per record
                cache = copy.deepcopy(self._gen_prefix[1])
                feed = ids[cache_prefix_len:]
            else:
                cache = make_prompt_cache(self.model)
                feed = ids
            eos = set(self.eos_token_ids)
            new: list[int] = []
            while len(new) < max_new_tokens:
                logits = self._call(mx.array([feed], dtype=mx.int32), cache, [len(feed) - 1])
                token = mx.argmax(logits[0, : self.tokenizer.vocab_size])
                mx.eval(token)
                new.append(int(token.item()))
                if new[-1] in eos:
                    break
                feed = new[-1:]
        return new, self.forward_passes - before

    def peak_memory_mb(self) -> float:
        """Peak memory of MLX's allocator in this process so far, in MiB."""
        return mx.get_peak_memory() / 2**20


def pick_device(device: str):
    """``auto`` -> the Apple GPU when Metal is available, else CPU; ``mps``/``gpu`` = the Apple GPU.

    Raises:
        ModelError: ``cuda``, or a GPU asked for where Metal is not available.
    """
    metal = mx.metal.is_available()
    if device == "auto":
        return mx.gpu if metal else mx.cpu
    if device == "cpu":
        return mx.cpu
    if device in ("mps", "gpu"):
        if not metal:
            raise ModelError(f"--backend mlx --device {device}: no Apple GPU (Metal) here; use --device cpu")
        return mx.gpu
    if device == "cuda":
        raise ModelError("--backend mlx --device cuda: the MLX backend runs on the Apple GPU (--device mps) "
                         "or the CPU; for CUDA use --backend torch")
    raise ModelError(f"--device {device!r}: expected auto, cpu, cuda or mps")


def pick_dtype(dtype: str, device) -> mx.Dtype | None:
    """``auto`` -> float32 on CPU, float16 on the Apple GPU (``None`` keeps the stored dtype for
    16-bit and quantized checkpoints); else the named dtype.

    Raises:
        ModelError: an unknown dtype name.
    """
    if dtype == "auto":
        return mx.float32 if device == mx.cpu else None
    if dtype not in DTYPES:
        raise ModelError(f"--dtype {dtype!r}: expected auto, float32, bfloat16 or float16")
    return DTYPES[dtype]


def load_backend(model: str | None = None, *, device: str = "auto", dtype: str = "auto") -> MLXBackend:
    """Load a model for pcd with mlx-lm.

    Args:
        model: ``None`` for the embedded default (its converted folder), a ``.gguf`` file
            (converted once, as for torch), a local HF-format or mlx-community folder, or a
            Hugging Face id (downloaded by mlx-lm).
        device: ``auto|cpu|mps`` (``mps`` = the Apple GPU). dtype: ``auto|float32|bfloat16|float16``.

    Raises:
        ModelError: the model cannot be found or loaded, or the device/dtype makes no sense here.
    """
    from .torch_backend import resolve_model

    mx_device = pick_device(device)
    mx_dtype = pick_dtype(dtype, mx_device)
    model_id, source = resolve_model(model)
    layout = _layout(source)
    config_file = Path(source) / "config.json"
    overrides = rope_config_overrides(json.loads(config_file.read_text())) if config_file.is_file() else {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            lm, wrapper = mlx_lm.load(source, model_config=overrides or None)
    except (OSError, ValueError, KeyError, FileNotFoundError) as exc:
        raise ModelError(f"--model {model!r}: mlx-lm cannot load it ({str(exc).splitlines()[0]})") from exc
    if mx_dtype is None:
        stored = {v.dtype for _, v in _float_params(lm)}
        mx_dtype = mx.float16 if stored == {mx.float32} else None
    if mx_dtype is not None:
        lm.set_dtype(mx_dtype)
    mx.eval(lm.parameters())
    eos = set(getattr(wrapper, "eos_token_ids", ()) or ())
    config = Path(source) / "generation_config.json"
    if config.is_file():
        value = json.loads(config.read_text()).get("eos_token_id")
        eos |= set(value if isinstance(value, list) else [value] if value is not None else [])
    windows = [layout.window if t == "sliding_attention" else None for t in layout.layer_types]
    backend = MLXBackend(lm, wrapper._tokenizer, model_id, device=mx_device, eos_token_ids=sorted(eos),
                         windows=windows)
    backend.content_source = (model, None)  # for content_key
    return backend


def _layout(source: str):
    """The transformers attention layout of ``source`` (per-layer full/sliding, the window),
    refusing architectures pcd cannot score exactly or this backend does not drive, before
    any weight is read.

    Raises:
        ModelError: recurrent/hybrid/chunked layers (``torch_arch.attention_layout``), or a
            ``model_type`` outside ``SUPPORTED_TYPES``.
    """
    from transformers import AutoConfig

    from .torch_arch import attention_layout

    try:
        config = AutoConfig.from_pretrained(source)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelError(f"--model {source!r}: cannot read its config ({str(exc).splitlines()[0]})") from exc
    layout = attention_layout(config)
    model_type = getattr(config, "model_type", "")
    if model_type not in SUPPORTED_TYPES:
        raise ModelError(f"--backend mlx: model type {model_type!r} is not one the MLX backend scores exactly "
                         f"(supported: {', '.join(SUPPORTED_TYPES)}); use --backend torch")
    return layout


def _rope_keys(params: dict) -> dict:
    """``rope_theta`` and ``rope_scaling`` (``None`` for plain RoPE) from one transformers-5
    ``rope_parameters`` entry."""
    scaling = None if params.get("rope_type", "default") == "default" else dict(params)
    return {"rope_theta": params.get("rope_theta"), "rope_scaling": scaling}


def rope_config_overrides(config: dict) -> dict:
    """Config keys to give mlx-lm for a transformers-5 ``config.json``.

    transformers 5 nests ``rope_theta`` and the scaling under ``rope_parameters`` (per layer
    type for Gemma 3: ``full_attention``/``sliding_attention``); mlx-lm's llama, qwen2 and
    gemma3 read the old top-level keys and would silently fall back to their defaults
    (SmolLM2: theta 10,000 instead of 100,000). Likewise Gemma 3's ``layer_types`` becomes
    mlx-lm's ``sliding_window_pattern``. Returns top-level keys to override (a whole
    ``text_config`` for models that nest one); empty when nothing needs translating.
    """
    def fixed(cfg: dict) -> dict | None:
        params = cfg.get("rope_parameters")
        if not isinstance(params, dict) or cfg.get("rope_theta") is not None:
            return None
        if "full_attention" in params or "sliding_attention" in params:
            full = params.get("full_attention") or {}
            keys = _rope_keys(full)
            local = (params.get("sliding_attention") or {}).get("rope_theta")
            if local is not None:
                keys["rope_local_base_freq"] = local
        else:
            keys = _rope_keys(params)
        return {k: v for k, v in keys.items() if v is not None or k == "rope_scaling"}

    def pattern(cfg: dict) -> dict:
        """Gemma 3: mlx-lm reads ``sliding_window_pattern``, transformers 5 writes ``layer_types``."""
        types = cfg.get("layer_types")
        if not str(cfg.get("model_type", "")).startswith("gemma3") or cfg.get("sliding_window_pattern") \
                or not isinstance(types, list) or "full_attention" not in types:
            return {}
        p = types.index("full_attention") + 1
        if any((t == "full_attention") != (i % p == p - 1) for i, t in enumerate(types)):
            raise ModelError(f"--backend mlx: layer types {types} are not the periodic sliding/full pattern "
                             "mlx-lm's Gemma 3 expects; use --backend torch")
        return {"sliding_window_pattern": p}

    out = {**(fixed(config) or {}), **pattern(config)}
    text = config.get("text_config")
    if isinstance(text, dict):
        text_fix = {**(fixed(text) or {}), **pattern({"model_type": config.get("model_type"), **text})}
        if text_fix:
            out["text_config"] = {**text, **text_fix}
    return out


def _float_params(module):
    from mlx.utils import tree_flatten

    return [(k, v) for k, v in tree_flatten(module.parameters()) if mx.issubdtype(v.dtype, mx.floating)]

