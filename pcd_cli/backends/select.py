"""Which backends exist and which one runs a model: the one place that names them
(``--backend auto|torch|mlx``). Everything outside ``backends/`` asks here (``KINDS``,
``kind_of``, ``library_versions``, ``takes_adapters``) instead of testing a backend's class.

Framework-free: it imports torch or mlx only once the choice is made.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import platform
import sys
from dataclasses import dataclass

from ..errors import ModelError


@dataclass(frozen=True)
class BackendKind:
    """One backend pcd can run a model on.

    Attributes:
        name: its ``--backend`` name; a loaded backend says it as its ``kind`` attribute
            (``load_backend`` loads a model on it).
        libraries: the distributions whose versions can change its probabilities (beyond
            rounding, in half precision): a resumed ``pcd label`` run records them
            (``library_versions``) and starts over when one changed.
        adapters: a LoRA adapter (``pcd tune --adapter-only``) is merged into its weights at load.
    """

    name: str
    libraries: tuple[str, ...]
    adapters: bool


#: The backends, by ``--backend`` name: ``auto`` picks one of them (``pick_backend``).
KINDS = {
    "torch": BackendKind("torch", ("torch", "transformers"), adapters=True),
    "mlx": BackendKind("mlx", ("mlx", "mlx-lm"), adapters=False),
}
BACKENDS = ("auto", *KINDS)
#: The backend ``pcd tune`` trains on (``prefill_train``/``forward_train``; ``backends.torch_tune``).
TRAINING_BACKEND = "torch"
#: What to run when ``--backend mlx`` finds no mlx-lm.
MLX_INSTALL_HINT = ("pip install 'pcd-cli[mlx]' (mlx-lm; on Linux it adds mlx[cpu]), "
                    "or use --backend torch")


def mlx_available() -> bool:
    """Whether mlx-lm (and mlx under it) can be imported here, without importing them."""
    return all(importlib.util.find_spec(name) is not None for name in ("mlx", "mlx_lm"))


def is_apple_silicon() -> bool:
    """macOS on arm64 (where MLX uses the GPU)."""
    return sys.platform == "darwin" and platform.machine() == "arm64"


def pick_backend(backend: str = "auto") -> str:
    """``auto`` -> ``mlx`` on macOS arm64 when mlx-lm is importable, else ``torch``.

    Raises:
        ModelError: an unknown name.
    """
    if backend not in BACKENDS:
        raise ModelError(f"--backend {backend!r}: expected {', '.join(BACKENDS[:-1])} or {BACKENDS[-1]}")
    if backend == "auto":
        return "mlx" if is_apple_silicon() and mlx_available() else "torch"
    return backend


def load_backend(model: str | None = None, *, backend: str = "auto", device: str = "auto", dtype: str = "auto"):
    """Load ``model`` on the backend ``backend`` names (see ``pick_backend``).

    Args:
        model: ``None`` for the embedded default, a ``.gguf`` file, a local folder or a
            model id.
        backend: ``auto|torch|mlx``. device: ``auto|cpu|cuda|mps`` (mlx: ``auto|cpu|mps``,
            ``mps`` meaning the Apple GPU). dtype: ``auto|float32|bfloat16|float16``.

    Returns:
        a ``TorchBackend`` or an ``MLXBackend``.

    Raises:
        ModelError: the model cannot be loaded, the backend is not installed (mlx: the
            message says how to install it), or device/dtype make no sense for it.
    """
    kind = pick_backend(backend)
    if kind == "mlx":
        try:
            from . import mlx_backend
        except ImportError as exc:
            raise ModelError(f"--backend mlx needs mlx-lm, which cannot be imported here ({exc}); "
                             f"install it with: {MLX_INSTALL_HINT}") from exc
        return mlx_backend.load_backend(model, device=device, dtype=dtype)
    from . import torch_backend

    return torch_backend.load_backend(model, device=device, dtype=dtype)


def kind_of(backend) -> BackendKind | None:
    """The ``BackendKind`` of a loaded backend (its ``kind`` attribute), or ``None`` for one
    that names none (a test's stand-in)."""
    return KINDS.get(getattr(backend, "kind", None))


def library_versions(backend) -> dict[str, str | None]:
    """Distribution name -> installed version (``None``: not installed) of the libraries that can
    change ``backend``'s probabilities (``BackendKind.libraries``): what a resumable run records.
    Empty for a backend of no known kind."""
    kind = kind_of(backend)
    return {name: _version_of(name) for name in (kind.libraries if kind is not None else ())}


def takes_adapters(backend) -> bool:
    """Whether a LoRA adapter can be merged into ``backend``: a loaded backend, or a
    ``--backend`` name (``auto``: whether any backend it may pick can; checked before loading)."""
    if isinstance(backend, str):
        return any(k.adapters for k in KINDS.values()) if backend == "auto" else \
            backend in KINDS and KINDS[backend].adapters
    kind = kind_of(backend)
    return kind is not None and kind.adapters


def _version_of(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None
