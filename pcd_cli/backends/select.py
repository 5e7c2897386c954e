"""Which backend runs a model: the one place that decides (``--backend auto|torch|mlx``).

Framework-free: it imports torch or mlx only once the choice is made.
"""

from __future__ import annotations

import importlib.util
import platform
import sys

from ..errors import ModelError

BACKENDS = ("auto", "torch", "mlx")
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
        raise ModelError(f"--backend {backend!r}: expected auto, torch or mlx")
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
