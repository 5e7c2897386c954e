"""``pcd serve``: the command's work behind its options (``pcd_cli.cli.serve`` stays thin).

Importable without the server extra: the check for it (``need_extra``) is the first thing
``serve_command`` does.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import sys
from dataclasses import replace
from importlib.util import find_spec
from pathlib import Path

from ..errors import InputError, MissingExtra

#: Schema file extensions read from a ``--schema`` folder.
SCHEMA_SUFFIXES = (".yaml", ".yml", ".json")
#: Environment variable holding an API key (added to ``--api-key`` and ``--api-key-file``).
API_KEY_ENV = "PCD_API_KEY"


def need_extra() -> None:
    """Raise ``MissingExtra`` (exit 3) naming the install line when the server extra is missing."""
    missing = [module for module in ("starlette", "uvicorn", "prometheus_client") if find_spec(module) is None]
    if missing:
        raise MissingExtra(f"pcd serve needs {', '.join(missing)}, which is not installed; install the server "
                           "extra with: pip install 'pcd-cli[serve]'")


def schema_sources(specs: list[str]) -> dict[str, Path]:
    """``--schema`` values as name -> file: ``NAME=PATH``, a file (name: its stem) or a folder
    (each ``.yaml``/``.yml``/``.json`` file in it, name: its stem).

    Raises:
        InputError: a path that does not exist, an empty folder, a bad or repeated name.
    """
    out: dict[str, Path] = {}
    for spec in specs:
        name, sep, path_text = spec.partition("=")
        if sep and name and not Path(spec).exists():
            items = [(name.strip(), Path(path_text).expanduser())]
            if not items[0][1].is_file():
                raise InputError(f"--schema {spec!r}: no schema file {path_text!r}")
        else:
            path = Path(spec).expanduser()
            if path.is_dir():
                files = sorted(p for p in path.iterdir() if p.suffix.lower() in SCHEMA_SUFFIXES and p.is_file())
                if not files:
                    raise InputError(f"--schema {spec!r}: the folder holds no .yaml, .yml or .json schema file")
                items = [(p.stem, p) for p in files]
            elif path.is_file():
                items = [(path.stem, path)]
            else:
                raise InputError(f"--schema {spec!r}: no such file or folder (give NAME=PATH, a file or a folder)")
        for name, path in items:
            if not name or not all(c.isalnum() or c in "._-" for c in name):
                raise InputError(f"--schema {spec!r}: the name {name!r} must be letters, digits, '.', '_' or '-'")
            if name in out:
                raise InputError(f"--schema: the name {name!r} is given twice ({out[name]} and {path}); "
                                 "name one of them with NAME=PATH")
            out[name] = path
    if not out:
        raise InputError("--schema: give at least one schema (NAME=PATH, a file or a folder)")
    return out


def per_schema_files(option: str, specs: list[str], names: list[str]) -> dict[str, str]:
    """``--calibration`` or ``--examples`` values as schema name -> file (``NAME=PATH``; a bare PATH
    when one schema is served).

    Raises:
        InputError: an unknown schema name, a missing file, a bare path with several schemas, a
            schema given twice; each names ``option``.
    """
    out: dict[str, str] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or Path(spec).exists():
            if len(names) != 1:
                raise InputError(f"{option} {spec!r}: several schemas are served; give NAME=PATH")
            name, path = names[0], spec
        if name not in names:
            raise InputError(f"{option} {spec!r}: no served schema is named {name!r} (served: "
                             f"{', '.join(names)})")
        if not Path(path).expanduser().is_file():
            raise InputError(f"{option} {spec!r}: no such file {path!r}")
        if name in out:
            raise InputError(f"{option}: schema {name!r} is given two files ({out[name]} and {path})")
        out[name] = str(Path(path).expanduser())
    return out


def calibrations(specs: list[str], names: list[str]) -> dict[str, str]:
    """``--calibration`` values as schema name -> file (``per_schema_files``)."""
    return per_schema_files("--calibration", specs, names)


def served_jobs(job, parsed: dict, *, calibration: list[str], examples: list[str]) -> dict:
    """Each served schema's job: ``job`` (``pcd serve``'s options) with that schema's
    ``--calibration`` and ``--examples`` file (``NAME=PATH``), the examples drawn once.

    Returns:
        name -> (schema, ``LabelJob``), as ``LabelService`` takes them.

    Raises:
        InputError: see ``per_schema_files``; ``--calibration`` with ``--no-calibration``; an
            examples file without enough usable rows. CalibrationError: ``--abstain-unless-single``
            with a schema whose calibration has no label sets.
    """
    names = list(parsed)
    cal = per_schema_files("--calibration", calibration, names)
    shots = per_schema_files("--examples", examples, names)
    out = {}
    for name, schema in parsed.items():
        served = replace(job, calibration=cal.get(name, job.calibration), examples=shots.get(name, job.examples))
        out[name] = (schema, served.with_examples(schema))
    return out


def api_keys(keys: list[str], key_file: Path | None) -> tuple[str, ...]:
    """The accepted keys: ``--api-key`` values, the lines of ``--api-key-file`` (blank lines and
    ``#`` comments skipped) and ``$PCD_API_KEY``.

    Raises:
        InputError: the key file cannot be read or holds no key.
    """
    out = [k.strip() for k in keys if k.strip()]
    if key_file is not None:
        try:
            lines = Path(key_file).expanduser().read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise InputError(f"--api-key-file {str(key_file)!r}: {exc.strerror or exc}") from None
        found = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
        if not found:
            raise InputError(f"--api-key-file {str(key_file)!r} holds no key (one key a line)")
        out.extend(found)
    if os.environ.get(API_KEY_ENV, "").strip():
        out.append(os.environ[API_KEY_ENV].strip())
    return tuple(dict.fromkeys(out))


def is_loopback(host: str) -> bool:
    """Whether ``host`` only listens on this machine (``localhost``, ``127.0.0.0/8``, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def serve_command(*, schemas: list[str], job, calibration: list[str], examples: list[str], host: str, port: int,
                  keys: list[str], key_file: Path | None, allow_public_without_key: bool, cors_origins: list[str],
                  service_config, app_config, shutdown_timeout_s: float, quiet: bool, engine: str = "local",
                  replicas: int | None = None, label_studio: bool = False, label_studio_url: str | None = None,
                  retrain_every: int = 0, tune_from_rows: int | None = None, state_dir: Path | None = None) -> int:
    """Run ``pcd serve`` until drained; returns the exit code.

    Args:
        job: the ``LabelJob`` given on the command line (model, adapter and labelling options);
            each startup schema gets it with its own ``calibration`` and ``examples`` file
            (``served_jobs``), request-built question sets get ``job.for_questions()``.
        service_config, app_config: ``ServiceConfig`` and ``AppConfig`` (keys and CORS added here).
        engine, replicas: ``local`` (this process) or ``ray``: ``replicas`` replicas on Ray Serve
            (``pcd_cli.server.ray_serve``), each building the same service and app.
        label_studio, label_studio_url, retrain_every, tune_from_rows, state_dir: the Label Studio
            ML backend (``label_studio_config``; ``pcd_cli.server.label_studio``).

    Raises:
        MissingExtra: the server extra, or Ray Serve for ``--engine ray``, is not installed (exit 3).
        InputError: bad ``--schema``, ``--calibration``, ``--examples``, key options, or a
            non-loopback ``--host`` without a key and without ``--allow-public-without-key`` (exit 2).
        SchemaError: a schema file is invalid (exit 2).
    """
    need_extra()
    if replicas is not None and engine != "ray":
        raise InputError("--replicas applies to --engine ray only")
    studio = label_studio_config(label_studio, url=label_studio_url, retrain_every=retrain_every,
                                 tune_from_rows=tune_from_rows, state_dir=state_dir, engine=engine)
    if engine == "ray":
        from .ray_serve import require_serve

        require_serve()
    from ..schema.load import load_schema
    from .main import cannot_listen, serve
    from .service import LabelService, ModelHost

    sources = schema_sources(schemas)
    parsed = {name: load_schema(path) for name, path in sources.items()}
    job = job.resolved()  # absolute paths: workers and replicas may run elsewhere
    served = served_jobs(job, parsed, calibration=calibration, examples=examples)
    accepted = api_keys(keys, key_file)
    if not accepted and not is_loopback(host) and not allow_public_without_key:
        raise InputError(f"--host {host}: listening beyond this machine without an API key; give --api-key, "
                         f"--api-key-file or ${API_KEY_ENV}, or pass --allow-public-without-key to serve "
                         "anyone who can reach the port")
    _logging(quiet)
    app_config = replace(app_config, api_keys=accepted, cors_origins=tuple(cors_origins), label_studio=studio)
    if engine == "ray":
        from .ray_serve import ReplicaSpec, serve_on_ray

        spec = ReplicaSpec(served, job=job, service=service_config, default_options=job.for_questions(),
                           app=app_config, listen_host=host)
        return serve_on_ray(spec, host=host, port=port, replicas=replicas or 1, shutdown_timeout_s=shutdown_timeout_s)
    service = LabelService(ModelHost(job), served, config=service_config, default_options=job.for_questions())
    try:
        return serve(service, app_config, host=host, port=port, shutdown_timeout_s=shutdown_timeout_s)
    except OSError as exc:
        raise cannot_listen(host, port, exc.strerror or str(exc)) from None


#: ``--state-dir``'s default.
DEFAULT_STATE_DIR = Path("~/.cache/pcd/serve-state")


def label_studio_config(enabled: bool, *, url: str | None, retrain_every: int, tune_from_rows: int | None,
                        state_dir: Path | None, engine: str = "local"):
    """``--label-studio``'s ``LabelStudioConfig`` (``None`` without it).

    Raises:
        InputError: a Label Studio option without ``--label-studio`` (names it); ``--label-studio``
            with ``--engine ray`` (each replica would keep its own journal); a ``--label-studio-url``
            that is not http(s).
    """
    from ..retrain import TUNE_FROM_ROWS
    from .label_studio import LabelStudioConfig

    if not enabled:
        given = [flag for flag, value in (("--label-studio-url", url), ("--retrain-every", retrain_every or None),
                                          ("--state-dir", state_dir)) if value is not None]
        if tune_from_rows not in (None, TUNE_FROM_ROWS):
            given.append("--tune-from-rows")
        if given:
            raise InputError(f"{', '.join(given)}: applies to --label-studio only; add --label-studio")
        return None
    if engine != "local":
        raise InputError("--label-studio with --engine ray: the gold journal and the retrained model live in one "
                         "process; serve Label Studio with --engine local")
    if url is not None and not url.startswith(("http://", "https://")):
        raise InputError(f"--label-studio-url {url!r}: give Label Studio's http:// or https:// address")
    folder = Path(state_dir or DEFAULT_STATE_DIR).expanduser()
    check_state_dir(folder)
    return LabelStudioConfig(state_dir=str(folder / "label-studio"), label_studio_url=url, retrain_every=retrain_every,
                             tune_from_rows=tune_from_rows or TUNE_FROM_ROWS)


def check_state_dir(folder: Path) -> None:
    """Refuse, before the model loads, a ``--state-dir`` the Label Studio backend cannot keep its
    journals and versions in: its ``label-studio/projects`` and ``label-studio/schemas`` folders
    are created and a temporary file written in each, for real (permission bits say nothing to
    root; a read-only mount or ``/proc`` refuse anyway).

    Raises:
        InputError: a folder cannot be created or written (exit 2); names ``--state-dir``, the
            folder and the system's reason.
    """
    import tempfile

    from ..io.files import os_reason

    if folder.exists() and not folder.is_dir():
        raise InputError(f"--state-dir {str(folder)!r}: is a file, not a folder; give a folder for pcd's gold journals "
                         "and model versions")
    for sub in (folder / "label-studio" / "projects", folder / "label-studio" / "schemas"):
        try:
            sub.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            where = exc.filename if isinstance(exc.filename, str) else str(sub)
            raise InputError(f"--state-dir {str(folder)!r}: cannot create the folder {where!r} ({os_reason(exc)}); "
                             "give a folder pcd can write its gold journals and model versions in") from None
        try:
            tempfile.TemporaryFile(dir=sub).close()
        except OSError as exc:
            raise InputError(f"--state-dir {str(folder)!r}: cannot write in {str(sub)!r} ({os_reason(exc)}); give a "
                             "folder pcd can write its gold journals and model versions in") from None


class _CurrentStderr(logging.StreamHandler):
    """A ``StreamHandler`` writing to whatever ``sys.stderr`` is when a line is written, never to
    the stream of the moment it was made: a server started by a test runner (or anything that
    swaps stderr and closes the old one) would otherwise log into a closed file ("--- Logging
    error ---"). The standard library's own last-resort handler does the same."""

    def __init__(self):
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value):
        pass


def _logging(quiet: bool) -> None:
    """One line per event on stderr: time, level, message (the request id leads request lines)."""
    handler = _CurrentStderr()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for name in ("pcd.server", "uvicorn.error"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(logging.WARNING if quiet else logging.INFO)
        logger.propagate = False
