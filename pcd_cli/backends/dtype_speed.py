"""bfloat16 on CPUs that have it (issue #38 item 5): what ``pcd bench`` measured, and the one line
``pcd label`` says about it.

``--dtype auto`` stays float32 on a CPU (reproducible across machines: a bfloat16 run's
probabilities move by up to ~0.09 and a few labels change). On a CPU that advertises
``avx512_bf16`` or ``amx_bf16``, ``pcd bench`` (``--compare-dtype``, its default) times both dtypes on
the user's records and keeps the result here, per model (``record_measurement``); a later
``pcd label`` in float32 on that model then says once, in its summary, how much faster bfloat16
was measured and how many labels agreed (``bfloat16_note``). Without a measurement it says
nothing: a speed-up is measured, never assumed.

The file: ``<cache>/dtype-speed.json`` (``torch_backend.cache_dir``), ``{model id: {"speedup",
"labels_equal", "decisions", "max_abs_dprob", "schema", "records", "measured_at"}}``.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

#: below this measured speed-up bfloat16 is not worth a line
WORTH = 1.05
FILE_NAME = "dtype-speed.json"


def cpu_has_float16() -> bool:
    """Whether this CPU advertises float16 arithmetic (``avx512_fp16`` or ``amx_fp16``, Linux
    ``/proc/cpuinfo``; ``False`` elsewhere)."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return "avx512_fp16" in flags or "amx_fp16" in flags


def cpu_has_bfloat16() -> bool:
    """Whether this CPU advertises ``avx512_bf16`` or ``amx_bf16`` (Linux ``/proc/cpuinfo``;
    ``False`` elsewhere)."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def bfloat16_would_run(backend) -> bool:
    """Whether bfloat16 is an alternative to ``backend``: a torch backend on CPU in float32, on a
    CPU with bfloat16."""
    return (str(getattr(backend, "device", "")) == "cpu" and getattr(backend, "dtype_name", "") == "float32"
            and type(backend).__name__ == "TorchBackend" and cpu_has_bfloat16())


def _path() -> Path:
    from ..io.files import cache_dir

    return cache_dir() / FILE_NAME


def _read() -> dict:
    try:
        data = json.loads(_path().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def record_measurement(model_id: str, measured: dict, *, schema: str, records: int) -> None:
    """Keep ``pcd bench``'s bfloat16-vs-float32 result (``bench.compare_dtypes``) for ``model_id``
    (the latest measurement wins). A cache folder that cannot be written is skipped silently: the
    note is a convenience."""
    data = _read()
    data[model_id] = {"speedup": round(float(measured["speedup"]), 3), "labels_equal": int(measured["labels_equal"]),
                      "decisions": int(measured["decisions"]), "max_abs_dprob": round(float(measured["max_abs_dprob"]), 4),
                      "schema": schema, "records": records,
                      "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    path = _path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2) + "\n")
    except OSError:
        pass


def bfloat16_note(backend) -> str | None:
    """The line ``pcd label`` says once when ``backend`` runs float32 on a CPU with bfloat16 and
    ``pcd bench`` measured bfloat16 faster for this model here (``None`` otherwise)."""
    if not bfloat16_would_run(backend):
        return None
    m = _read().get(getattr(backend, "model_id", ""))
    if not isinstance(m, dict) or float(m.get("speedup", 0.0)) < WORTH:
        return None
    return (f"this CPU has bfloat16: pcd bench measured --dtype bfloat16 {m['speedup']:.2f}x faster for this model "
            f"({m['labels_equal']}/{m['decisions']} labels equal, max |dp| {m['max_abs_dprob']:.3f}, "
            f"{m['records']} records of {m['schema']}); float32 stays the default (reproducible across machines)")


def dtype_note(backend) -> str | None:
    """The line ``pcd label`` says once when ``--dtype`` asked for half precision that is a poor
    choice for ``backend``'s device (issue #45): float16 on a CPU; bfloat16 on a CPU without
    bfloat16 instructions, or where ``pcd bench`` measured it slower for this model (``None``
    otherwise, and for a GPU, where half precision is what it is fast at).

    Half precision is less exact everywhere (a bfloat16 run's probabilities move by up to ~0.09,
    ``benchmarks``); on a CPU without the instructions each product is converted to float32 and
    back, so it is slower too. A CPU that has them (``cpu_has_float16``, ``cpu_has_bfloat16``)
    is told only what a measurement found.
    """
    if str(getattr(backend, "device", "")) != "cpu" or type(backend).__name__ != "TorchBackend":
        return None
    dtype = getattr(backend, "dtype_name", "")
    measured = _read().get(getattr(backend, "model_id", ""))
    if dtype == "float16" and not cpu_has_float16():
        why = "this CPU has no float16 arithmetic: slower than float32 here, and less exact"
    elif dtype == "bfloat16" and not cpu_has_bfloat16():
        why = "this CPU has no bfloat16 instructions: slower than float32 here, and less exact"
    elif dtype == "bfloat16" and isinstance(measured, dict) and float(measured.get("speedup", 1.0)) < 1.0:
        why = (f"pcd bench measured it {measured['speedup']:.2f}x the speed of float32 for this model here "
               f"(slower), and less exact ({measured['labels_equal']}/{measured['decisions']} labels equal)")
    else:
        return None
    return (f"--dtype {dtype} is a poor choice for this device: {why}; float32 (the default on a CPU) is faster "
            "here and more exact")
