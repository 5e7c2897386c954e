"""What a transformers model's architecture asks of an exact forest pass (issue #13).

* **Attention layout.** Each decoder layer attends either to every earlier key
  (``full_attention``) or to the keys less than ``sliding_window`` positions before the
  query (``sliding_attention``: Mistral, Phi-3-4k, Gemma 2/3, gpt-oss, Qwen2 with
  ``use_sliding_window``). The backend keeps every key of every layer in its cache and
  builds one mask per layer type, the window measured in *position* distance between the
  query's and the key's (tree) positions — exactly the mask a plain forward over the
  record's own text gives that layer (``masking_utils.sliding_window_overlay``:
  ``q - k < window``). Models mixing both types get a ``{layer type: mask}`` dict, which
  transformers 5.x models with ``layer_types`` accept in place of a mask.
* **Refused architectures.** Layers whose state is not a per-token KV cache (recurrent,
  convolutional or linear-attention layers: Mamba, Jamba, Qwen3-Next, RWKV, xLSTM, LFM2,
  Falcon-H1...), chunked attention (Llama 4) and KV sharing between layers cannot be
  scored as a tree of tokens on a cropped cache; ``attention_layout`` refuses them at
  load time (``ModelError``, exit 3) with the reason.
* **Long-context RoPE.** ``longrope`` (Phi-3/3.5/4-mini-128k) switches from its short to
  its long frequency factors once a forward pass reaches past
  ``original_max_position_embeddings``; transformers picks the set from the largest
  position of each pass. A record is scored as a plain forward over its own complete
  text (prompt, record, whole answer) would score it: ``LongRope.variant(n)`` names the
  set for a text of ``n`` tokens, and ``LongRope.forced(variant)`` pins that set for a
  pass whatever its largest position. (``dynamic`` NTK scaling only changes frequencies
  beyond ``max_position_embeddings``, which the decoder never reaches: records are cut
  or refused before.)
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Hashable, Iterator

from ..errors import ModelError

#: Layer types a forest pass scores exactly.
SUPPORTED_LAYER_TYPES = ("full_attention", "sliding_attention")
#: Model families whose layers keep recurrent state, named by transformers ``model_type``
#: (for configs that do not list their layer types).
RECURRENT_MODEL_TYPES = frozenset({
    "mamba", "mamba2", "falcon_mamba", "jamba", "zamba", "zamba2", "bamba", "falcon_h1", "rwkv", "xlstm",
    "recurrent_gemma", "lfm2", "lfm2_moe", "lfm2_vl", "qwen3_next", "granitemoehybrid", "nemotron_h",
    "minimax", "plamo2", "hymba", "mllama", "qwen3_5", "qwen3_5_moe", "olmo_hybrid", "kimi_linear"})


@dataclass(frozen=True)
class AttentionLayout:
    """Per-layer attention kinds of a model.

    Attributes:
        layer_types: one of ``SUPPORTED_LAYER_TYPES`` per decoder layer.
        window: the sliding window in positions (``None`` without sliding layers): a key is
            seen by a sliding layer's query iff ``0 <= q_pos - k_pos < window``.
    """

    layer_types: tuple[str, ...]
    window: int | None

    @property
    def kinds(self) -> tuple[str, ...]:
        """The distinct layer types, in ``SUPPORTED_LAYER_TYPES`` order."""
        return tuple(t for t in SUPPORTED_LAYER_TYPES if t in self.layer_types)


def attention_layout(config) -> AttentionLayout:
    """The attention layout of a transformers config, or why it cannot be scored exactly.

    Raises:
        ModelError: encoder-decoder models, recurrent/hybrid/linear-attention layers,
            chunked attention, KV shared between layers, or mixed layer types on a model
            that does not take one mask per layer type.
    """
    from transformers.cache_utils import get_layer_types_and_kwargs

    text = config.get_text_config(decoder=True)
    name = getattr(text, "model_type", "") or getattr(config, "model_type", "")
    if getattr(config, "is_encoder_decoder", False):
        raise ModelError(f"model type {name!r} is an encoder-decoder model; pcd needs a decoder-only causal LM")
    if name in RECURRENT_MODEL_TYPES or getattr(config, "model_type", "") in RECURRENT_MODEL_TYPES:
        raise ModelError(f"model type {name!r} has recurrent (state-space, convolutional or linear-attention) "
                         "layers whose state cannot be cropped back or branched per token, so pcd cannot score "
                         "it exactly; use a transformer with full or sliding-window attention")
    layer_types, _ = get_layer_types_and_kwargs(text)
    other = sorted(set(layer_types) - set(SUPPORTED_LAYER_TYPES))
    if other:
        why = {"chunked_attention": "chunked attention", "dummy": "KV shared between layers"}
        reasons = ", ".join(why.get(t, f"{t} layers (recurrent state)") for t in other)
        raise ModelError(f"model type {name!r} has {reasons}, which pcd cannot score exactly on a cropped KV "
                         "cache; use a transformer whose layers all use full or sliding-window attention")
    window = getattr(text, "sliding_window", None) if "sliding_attention" in layer_types else None
    if "sliding_attention" in layer_types and not window:
        raise ModelError(f"model type {name!r} has sliding-window layers but no sliding_window in its config")
    return AttentionLayout(tuple(layer_types), int(window) if window else None)


def takes_mask_per_layer_type(model) -> bool:
    """Whether the model's forward accepts ``{layer type: mask}`` for ``attention_mask``
    (transformers 5.x models that build a mask per layer type check for a dict first)."""
    import inspect

    base = getattr(model, "model", model)
    base = getattr(base, "language_model", base)
    try:
        source = inspect.getsource(type(base).forward)
    except (OSError, TypeError):
        return False
    return "isinstance(causal_mask_mapping := attention_mask, dict)" in source


class LongRope:
    """The ``longrope`` rotary embeddings of a model (none: ``variant`` is always 0).

    Args:
        model: a transformers causal LM.
    """

    def __init__(self, model):
        self._model = model
        #: (rotary module, attribute prefix, layer type or None, original max positions)
        self._sites: list[tuple[object, str, str | None, int]] = []
        for module in model.modules():
            rope_type = getattr(module, "rope_type", None)
            config = getattr(module, "config", None)
            if config is None or not isinstance(rope_type, (str, dict)):
                continue
            params = getattr(config, "rope_parameters", None) or {}
            if isinstance(rope_type, dict):
                for layer_type, kind in rope_type.items():
                    if kind == "longrope":
                        self._sites.append((module, f"{layer_type}_", layer_type,
                                            int(params[layer_type]["original_max_position_embeddings"])))
            elif rope_type == "longrope" and hasattr(module, "original_inv_freq"):
                self._sites.append((module, "", None, int(params["original_max_position_embeddings"])))
        self.thresholds = tuple(sorted({site[3] for site in self._sites}))

    def variant(self, n_positions: int) -> Hashable:
        """0 when no threshold is passed (short factors everywhere), else the number of
        thresholds a text of ``n_positions`` tokens exceeds (1: long factors)."""
        return sum(n_positions > t for t in self.thresholds)

    @contextmanager
    def forced(self, variant: Hashable) -> Iterator[None]:
        """Pin every longrope site to the factor set of ``variant`` during the block."""
        if not self._sites:
            yield
            return
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        saved = []
        for module, prefix, layer_type, limit in self._sites:
            original = getattr(module, f"{prefix}original_inv_freq")
            long = getattr(module, f"{prefix}long_inv_freq", None)
            if long is None:
                kwargs = {"layer_type": layer_type} if layer_type else {}
                long, _ = ROPE_INIT_FUNCTIONS["longrope"](module.config, original.device, seq_len=limit + 1, **kwargs)
            saved.append((module, prefix, original, long))
            chosen = long if variant and variant > self.thresholds.index(limit) else original
            setattr(module, f"{prefix}original_inv_freq", chosen)
            setattr(module, f"{prefix}long_inv_freq", chosen)
        try:
            yield
        finally:
            for module, prefix, original, long in saved:
                setattr(module, f"{prefix}original_inv_freq", original)
                setattr(module, f"{prefix}long_inv_freq", long)
