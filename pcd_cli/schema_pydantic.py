"""Pydantic models as schemas: ``Labeler(MyModel)``, ``--schema path/to/models.py:MyModel``.

A model's fields become the schema's fields in declaration order: ``bool`` -> boolean;
``Literal["a", "b"]`` and ``enum.Enum`` subclasses -> enum (labels in declared order; an
Enum gives its members' values, which must be strings); ``Field(description=...)`` -> the
field's description (else an Enum's docstring, as ``model_json_schema()`` has it); the
class docstring -> the schema's instructions; a field's
``json_schema_extra={"depends_on": [...]}`` -> ``depends_on``. Any other type is a
``SchemaError`` naming the field and the type (``Optional[...]``: pcd has no null label yet).
The result goes through ``parse_schema``, so the same validation applies as to YAML schemas,
and every problem of the model is reported at once.

Pydantic itself is not imported here: a model is read through its ``model_fields``
(pydantic 2), so pcd needs pydantic only where the user's own model does.
"""

from __future__ import annotations

import enum
import importlib.util
import inspect
import sys
import types
import typing
from pathlib import Path

from .errors import MissingExtra, SchemaError
from .schema import Schema, Unparsed, parse_schema


def is_pydantic_model(obj: object) -> bool:
    """Whether ``obj`` is a Pydantic (v2) model class."""
    return inspect.isclass(obj) and isinstance(getattr(obj, "model_fields", None), dict) \
        and hasattr(obj, "model_json_schema")


def schema_from_model(model: type, *, source: str = "") -> Schema:
    """A validated ``Schema`` from a Pydantic model class (see the module docstring).

    Raises:
        SchemaError: a field whose type is not ``bool``, a ``Literal`` of strings or a
            string ``Enum`` (named with its type), or any check ``parse_schema`` makes; every
            problem of the model at once (``source``, else the model's name, names it then).
    """
    if not is_pydantic_model(model):
        raise SchemaError(f"{model!r} is not a Pydantic model class (a subclass of pydantic.BaseModel)")
    fields: dict[str, dict | Unparsed] = {}
    for name, info in model.model_fields.items():
        spec: dict = {"description": info.description or _enum_doc(info.annotation)}
        try:
            spec.update(_field_type(model.__name__, name, info.annotation))
        except SchemaError as exc:  # reported in its place, with every other problem of the model
            fields[info.alias or name] = Unparsed([str(exc)])
            continue
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        if "depends_on" in extra:
            spec["depends_on"] = extra["depends_on"]
        fields[info.alias or name] = spec
    doc = model.__dict__.get("__doc__")  # the class's own docstring, not BaseModel's
    return parse_schema({"name": model.__name__, "instructions": inspect.cleandoc(doc) if doc else "",
                         "fields": fields}, default_name=model.__name__, source=source or model.__name__)


def _field_type(model_name: str, name: str, annotation: object) -> dict:
    where = f"field {name!r} of {model_name}"
    if annotation is bool:
        return {"type": "boolean"}
    if typing.get_origin(annotation) is typing.Literal:
        labels = list(typing.get_args(annotation))
        bad = [v for v in labels if not isinstance(v, str)]
        if bad:
            raise SchemaError(f"{where}: Literal value {bad[0]!r} is a {type(bad[0]).__name__}; "
                              "labels must be strings")
        return {"type": "enum", "labels": labels}
    if inspect.isclass(annotation) and issubclass(annotation, enum.Enum):
        labels = [member.value for member in annotation]
        bad = [v for v in labels if not isinstance(v, str)]
        if bad:
            raise SchemaError(f"{where}: {annotation.__name__} has the value {bad[0]!r} "
                              f"({type(bad[0]).__name__}); labels must be strings")
        return {"type": "enum", "labels": labels}
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in typing.get_args(annotation):
        rest = [_type_name(a) for a in typing.get_args(annotation) if a is not type(None)]
        raise SchemaError(f"{where}: type Optional[{' | '.join(rest)}] (it allows None) is not supported yet: "
                          "pcd has no null label; make the field required")
    shown = getattr(annotation, "__name__", None) if inspect.isclass(annotation) else None
    raise SchemaError(f"{where}: type {shown or repr(annotation)} is not supported; use bool, "
                      "Literal['a', 'b', ...] or a str Enum")


def _enum_doc(annotation: object) -> str:
    """An ``Enum`` field's class docstring (what ``model_json_schema()`` writes as the
    definition's description, so a model and its JSON Schema give the same field)."""
    if inspect.isclass(annotation) and issubclass(annotation, enum.Enum):
        doc = annotation.__dict__.get("__doc__")
        if isinstance(doc, str) and doc.strip() and doc != "An enumeration.":
            return inspect.cleandoc(doc)
    return ""


def _type_name(annotation: object) -> str:
    """``Sentiment``, ``Literal['a', 'b']``: a type as written in the model, without module prefixes."""
    if inspect.isclass(annotation):
        return annotation.__name__
    return repr(annotation).replace("typing.", "")


def load_model_schema(ref: str) -> Schema:
    """Load ``path/to/models.py:ModelName`` (or ``path/to/models.py`` holding exactly one model).

    The file is imported as a module (its top level runs, as with ``python models.py``).

    Raises:
        SchemaError: no such file or model, the file fails to import, or the model is not
            a valid schema.
        MissingExtra: the file needs pydantic and it is not installed (exit 3 with how to).
    """
    path_text, name = (ref, "") if ref.endswith(".py") else ref.rsplit(":", 1)
    path = Path(path_text)
    if not path.is_file():
        raise SchemaError(f"--schema {ref!r}: no such Python file {str(path)!r}")
    module_name = f"_pcd_schema_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise SchemaError(f"--schema {ref!r}: cannot import {str(path)!r}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pydantic look their module up while building
    try:
        spec.loader.exec_module(module)
    except ModuleNotFoundError as exc:
        sys.modules.pop(module_name, None)
        if exc.name == "pydantic":
            raise MissingExtra(f"--schema {ref!r} needs pydantic: pip install 'pcd-cli[pydantic]'") from None
        raise SchemaError(f"--schema {ref!r}: importing {str(path)!r} failed ({exc})") from None
    except Exception as exc:  # noqa: BLE001 - the user's module can fail in any way; say where
        sys.modules.pop(module_name, None)
        raise SchemaError(f"--schema {ref!r}: importing {str(path)!r} failed ({type(exc).__name__}: {exc})") from None
    if name:
        model = getattr(module, name, None)
        if model is None:
            raise SchemaError(f"--schema {ref!r}: {str(path)!r} defines no {name!r}")
        if not is_pydantic_model(model):
            raise SchemaError(f"--schema {ref!r}: {name!r} is not a Pydantic model class")
        return schema_from_model(model, source=ref)
    models = [obj for obj in vars(module).values()
              if is_pydantic_model(obj) and getattr(obj, "__module__", None) == module_name]
    if len(models) != 1:
        found = ", ".join(m.__name__ for m in models) or "none"
        raise SchemaError(f"--schema {ref!r}: name the model as {str(path)}:ModelName (models found: {found})")
    return schema_from_model(models[0], source=f"{ref}:{models[0].__name__}")
