"""Pydantic models as schemas: ``Labeler(MyModel)``, ``--schema path/to/models.py:MyModel``.

A model's fields become the schema's fields in declaration order:

* ``bool`` -> boolean; ``Literal["a", "b"]`` and ``enum.Enum`` subclasses -> enum (labels in
  declared order; an Enum gives its members' values); a ``Literal`` or Enum (``IntEnum``) of
  whole numbers forming a range -> integer, of ``True`` and ``False`` -> boolean, as their JSON
  Schema reads (``jsonschema.typed_choice``; whole numbers with gaps are refused with a fix);
* ``int`` with both bounds (``Annotated[int, Field(ge=1, le=5)]``, ``Field(ge=..., le=...)``,
  also ``gt``/``lt``, ``conint(...)``) -> integer;
* ``list[...]``, ``set[...]``, ``frozenset[...]`` of a ``Literal`` or a str ``Enum`` -> multi
  (``Field(min_length=..., max_length=...)`` -> ``min_items``/``max_items``);
* ``Optional[X]`` / ``X | None`` -> X, ``nullable: true``;
* ``Field(json_schema_extra={...})``: ``"x-pcd-type": "ordinal"`` (on a Literal/Enum),
  ``"x-pcd-threshold"``, ``"x-pcd-none-label"`` (as in a JSON Schema, see
  ``pcd_cli.schema.jsonschema``) and ``"depends_on": [...]``;
* ``Field(description=...)`` -> the field's description (else an Enum's docstring, as
  ``model_json_schema()`` has it); the class docstring -> the schema's instructions; rules
  between fields (``pcd_cli.schema.rules``) from a ``__pcd_rules__`` class attribute or
  ``model_config = {"json_schema_extra": {"x-pcd-rules": [...]}}``.

A model and its own ``model_json_schema()`` give the same schema (same ``source_sha256``).
Any other type (``str``, ``float``, an ``int`` without both bounds, a union of types or of
models) is a ``SchemaError`` naming the field and the type as written (never the module name
the file was imported under). The result goes through ``parse_schema``, so
the same validation applies as to YAML schemas, and every problem of the model is reported
at once.

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

from ..errors import MissingExtra, SchemaError
from .jsonschema import RULES_KEY, apply_extensions, integer_bounds, typed_choice
from .model import MAX_INTEGER_VALUES, Unparsed


def is_pydantic_model(obj: object) -> bool:
    """Whether ``obj`` is a Pydantic (v2) model class."""
    return inspect.isclass(obj) and isinstance(getattr(obj, "model_fields", None), dict) \
        and hasattr(obj, "model_json_schema")


def model_data(model: type) -> dict:
    """A Pydantic model class as pcd-format schema data (``{name, instructions, fields, rules}``, the
    form a YAML file holds); ``pcd_cli.schema.load.schema_from_model`` validates it.

    A field whose type pcd cannot read is an ``Unparsed`` entry holding its problem (named with
    its type), so that ``parse_schema`` reports it with every other problem of the model.

    Raises:
        SchemaError: ``model`` is not a Pydantic model class.
    """
    if not is_pydantic_model(model):
        raise SchemaError(f"{model!r} is not a Pydantic model class (a subclass of pydantic.BaseModel)")
    fields: dict[str, dict | Unparsed] = {}
    for name, info in model.model_fields.items():
        spec: dict = {"description": info.description or _enum_doc(info.annotation)}
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        try:
            spec.update(_field_type(model.__name__, name, info.annotation, tuple(info.metadata)))
            problem = apply_extensions(f"field {name!r} of {model.__name__}", extra, spec)
            if problem:
                raise SchemaError(problem)
        except SchemaError as exc:  # reported in its place, with every other problem of the model
            fields[info.alias or name] = Unparsed([str(exc)])
            continue
        if "depends_on" in extra:
            spec["depends_on"] = extra["depends_on"]
        fields[info.alias or name] = spec
    doc = model.__dict__.get("__doc__")  # the class's own docstring, not BaseModel's
    data = {"name": model.__name__, "instructions": inspect.cleandoc(doc) if doc else "", "fields": fields}
    rules = _model_rules(model)
    if rules is not None:
        data["rules"] = rules
    return data


def _model_rules(model: type):
    """The model's rules between fields: a ``__pcd_rules__`` class attribute, else
    ``model_config["json_schema_extra"]["x-pcd-rules"]`` (which ``model_json_schema()`` writes
    at the top of the JSON Schema, so both forms give the same schema); ``None`` if neither."""
    rules = getattr(model, "__pcd_rules__", None)
    if rules is not None:
        return rules
    extra = getattr(model, "model_config", {}).get("json_schema_extra")
    return extra.get(RULES_KEY) if isinstance(extra, dict) else None


def _field_type(model_name: str, name: str, annotation: object, metadata: tuple = ()) -> dict:
    """The field spec of a model field's type. ``metadata``: its constraints (``Field(ge=...)``,
    ``conint``, ``Annotated[...]``: annotated_types objects), applied to the type under
    ``Optional``."""
    where = f"field {name!r} of {model_name}"
    annotation, inner = _unannotate(annotation)
    metadata = (*metadata, *inner)
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        rest = [a for a in args if a is not type(None)]
        if all(is_pydantic_model(a) for a in rest):
            raise SchemaError(f"{where}: type {_type_name(annotation)} (a union of objects, such as a discriminated "
                              "union) is not supported; pcd labels flat fields: give each choice's fields a field of "
                              "their own, e.g. a Literal for the kind and Optional[...] fields for the rest")
        if len(rest) == len(args):
            raise SchemaError(f"{where}: type {_type_name(annotation)} (a union of types) is not supported; "
                              f"{_USE}")
        literals = [a for a in rest if typing.get_origin(a) is typing.Literal]
        if len(rest) > 1 and len(literals) == len(rest):  # Literal['a'] | Literal['b'] | None
            rest = [typing.Literal[tuple(v for a in literals for v in typing.get_args(a))]]
        if len(rest) > 1:
            raise SchemaError(f"{where}: type Optional[{' | '.join(map(_type_name, rest))}] (a union of types) "
                              f"is not supported; {_USE}")
        return {**_field_type(model_name, name, rest[0], metadata), "nullable": True}
    if annotation is bool:
        return {"type": "boolean"}
    if annotation is int:
        return _integer(where, metadata)
    if typing.get_origin(annotation) is typing.Literal:
        return _choice(where, list(typing.get_args(annotation)), _type_name(annotation), "Literal value")
    if inspect.isclass(annotation) and issubclass(annotation, enum.Enum):
        return _choice(where, [member.value for member in annotation], annotation.__name__,
                       f"{annotation.__name__} has the value")
    if origin in (list, set, frozenset):
        (item,) = typing.get_args(annotation) or (typing.Any,)
        try:
            inner_spec = _field_type(model_name, name, item)
        except SchemaError:
            inner_spec = {}
        if inner_spec.get("type") != "enum" or inner_spec.get("nullable"):
            raise SchemaError(f"{where}: type {_type_name(annotation)} is not supported; a multi-select is "
                              "list[Literal['a', 'b', ...]] or set[MyEnum] (a str Enum)")
        spec = {"type": "multi", "labels": inner_spec["labels"]}
        for key in ("min_length", "max_length"):
            values = [getattr(m, key) for m in metadata if getattr(m, key, None) is not None]
            if values:
                spec["min_items" if key == "min_length" else "max_items"] = values[-1]
        return spec
    shown = getattr(annotation, "__name__", None) if inspect.isclass(annotation) else None
    raise SchemaError(f"{where}: type {shown or _type_name(annotation)} is not supported; {_USE}")


#: The types a model field may have, for messages.
_USE = ("use bool, Literal['a', 'b', ...] or a str Enum, int with Field(ge=..., le=...), "
        "list[Literal[...]] / set[MyEnum] (multi-select), or Optional[...] of one of them")


def _unannotate(annotation: object) -> tuple[object, tuple]:
    """``Annotated[T, ...]`` -> ``T`` and its metadata (a ``Field(...)`` inside gives its own
    constraints); anything else -> itself and no metadata."""
    if typing.get_origin(annotation) is not typing.Annotated:
        return annotation, ()
    base, *extras = typing.get_args(annotation)
    metadata: list = []
    for extra in extras:
        metadata.extend(getattr(extra, "metadata", None) or [extra])  # a FieldInfo holds its constraints
    base, inner = _unannotate(base)
    return base, (*inner, *metadata)


def _integer(where: str, metadata: tuple) -> dict:
    """``int`` with both bounds among ``metadata`` (``ge``/``gt``/``le``/``lt``) -> an integer field."""
    def last(key: str):
        values = [getattr(m, key) for m in metadata if getattr(m, key, None) is not None]
        return values[-1] if values else None

    if last("multiple_of") is not None:
        raise SchemaError(f"{where}: multiple_of on an int is not supported; pcd reads every whole number from "
                          "its lower to its upper bound: drop multiple_of, or list the values in a Literal")
    try:
        lo, hi = integer_bounds(last("ge"), last("gt"), last("le"), last("lt"))
    except ValueError as exc:
        raise SchemaError(f"{where}: {exc}") from None
    if lo is None or hi is None:
        raise SchemaError(f"{where}: type int without both bounds is not supported; pcd reads an integer as one "
                          "of its values: give Field(ge=..., le=...) (or gt/lt, conint), at most "
                          f"{MAX_INTEGER_VALUES} values")
    return {"type": "integer", "minimum": lo, "maximum": hi}


def _enum_doc(annotation: object) -> str:
    """An ``Enum`` field's class docstring (what ``model_json_schema()`` writes as the
    definition's description, so a model and its JSON Schema give the same field)."""
    if inspect.isclass(annotation) and issubclass(annotation, enum.Enum):
        doc = annotation.__dict__.get("__doc__")
        if isinstance(doc, str) and doc.strip() and doc != "An enumeration.":
            return inspect.cleandoc(doc)
    return ""


def _choice(where: str, values: list, construct: str, value_is: str) -> dict:
    """A ``Literal``'s or ``Enum``'s values as a field spec (``jsonschema.typed_choice``: strings
    -> enum, ``True``/``False`` -> boolean, a contiguous range of ints -> integer), the same as
    its JSON Schema gives; a mix with other values is refused naming the first one."""
    try:
        spec = typed_choice(where, values, construct)
    except ValueError as exc:
        raise SchemaError(str(exc)) from None
    bad = [v for v in spec.get("labels", ()) if not isinstance(v, str)]
    if bad:
        raise SchemaError(f"{where}: {value_is} {bad[0]!r} ({type(bad[0]).__name__}) among string values; labels "
                          "are strings (a Literal or Enum of only whole numbers, or of True and False, keeps "
                          "its type)")
    return spec


def _type_name(annotation: object) -> str:
    """``Sentiment``, ``Literal['a', 'b']``, ``Union[Refund, Replace]``: a type as written in the
    model, without module prefixes (not the name pcd imported the model file under)."""
    if annotation is type(None):
        return "None"
    if inspect.isclass(annotation) and not typing.get_args(annotation):
        return annotation.__name__
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return f"Literal[{', '.join(map(repr, args))}]"
    if origin is types.UnionType:
        return " | ".join(map(_type_name, args))
    if origin is typing.Union:
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and len(args) == 2:
            return f"Optional[{_type_name(rest[0])}]"
        return f"Union[{', '.join(map(_type_name, args))}]"
    if origin is not None and args:  # List[str] as written, list[str] too
        head = repr(annotation).split("[", 1)[0].rsplit(".", 1)[-1]
        return f"{head}[{', '.join(map(_type_name, args))}]"
    return repr(annotation).replace("typing.", "")


def load_model(ref: str) -> tuple[type, str]:
    """Import ``path/to/models.py:ModelName`` (or ``path/to/models.py`` holding exactly one model):
    the model class and how messages name it (``models.py:ModelName``).

    The file is imported as a module (its top level runs, as with ``python models.py``).

    Raises:
        SchemaError: no such file or model, or the file fails to import.
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
        return model, ref
    models = [obj for obj in vars(module).values()
              if is_pydantic_model(obj) and getattr(obj, "__module__", None) == module_name]
    if len(models) != 1:
        found = ", ".join(m.__name__ for m in models) or "none"
        raise SchemaError(f"--schema {ref!r}: name the model as {str(path)}:ModelName (models found: {found})")
    return models[0], f"{ref}:{models[0].__name__}"
