"""Giving a dropped model's memory back to the system (``pcd serve``'s swaps and retrains).

Dropping the last reference to a model frees its tensors, but the process's resident memory
need not fall: cyclic garbage (autograd graphs, peft wrappers) waits for the collector, the CUDA
and MPS allocators keep freed blocks cached, and glibc's ``malloc`` keeps freed heap pages unless
asked to trim them (``malloc_trim(3)``). ``release_memory`` does all three.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import sys


def release_memory() -> None:
    """Collect garbage, empty torch's CUDA/MPS caches (when torch is imported) and trim glibc's
    heap (``malloc_trim(0)``; nothing on other C libraries). Never raises."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            mps = getattr(torch, "mps", None)
            if mps is not None and torch.backends.mps.is_available():
                mps.empty_cache()
        except Exception:  # noqa: BLE001 - best effort
            pass
    try:
        name = ctypes.util.find_library("c")
        libc = ctypes.CDLL(name) if name else None
        trim = getattr(libc, "malloc_trim", None)
        if trim is not None:
            trim(0)
    except OSError:
        pass
