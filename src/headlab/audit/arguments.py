"""Constructor arguments from ``--init`` JSON, config objects included.

A JSON object given for a parameter becomes an object, so that constructors taking a config
(``__init__(self, config)``, as nanoGPT, minGPT and LLaMA write them) can be built from the
command line:

- where the parameter is annotated with a class (``args: ModelArgs``, a dataclass, say), that
  class built from the object's fields, each nested object by the class's own annotation;
- where it is annotated ``dict`` or ``Mapping``, the dict itself;
- otherwise a ``types.SimpleNamespace`` with the object's fields (nested objects too), which
  serves a constructor that reads ``config.n_embd``.

Nothing is evaluated: a field's value is the JSON value. ``Arguments.explain`` turns what a
constructor raised into a one-line fix: the parameter it misses (and the object to give for a
config), or the field of a config object it reads and ``--init`` does not give.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["Arguments"]

_PLAIN = (int, float, str, bool, list, tuple, dict, set, object, type(None))


def _resolved(target: Callable[..., Any], namespace: dict[str, Any]) -> dict[str, Any]:
    """The parameters' annotations as objects (string annotations looked up in ``namespace``)."""
    # a class's __init__ is read for its annotations, not called: the checker's warning (unsound call) does not apply
    function = target.__init__ if isinstance(target, type) else target  # type: ignore[misc]
    try:
        return typing.get_type_hints(function, globalns=namespace)
    except Exception:  # noqa: BLE001 - a user's annotation may raise anything: take the resolvable ones one by one
        raw = getattr(function, "__annotations__", {})
        return {k: namespace.get(v, v) if isinstance(v, str) else v for k, v in raw.items()}


def _config_class(annotation: Any) -> type | None:
    """The class an object value should become, from a parameter's annotation (``X | None`` → X)."""
    options = [a for a in typing.get_args(annotation) if a is not type(None)] \
        if typing.get_origin(annotation) in (typing.Union, types.UnionType) else [annotation]
    if len(options) != 1 or not isinstance(options[0], type):
        return None
    cls = options[0]
    return None if cls in _PLAIN or issubclass(cls, Mapping) else cls


def _mapping(annotation: Any) -> bool:
    origin = typing.get_origin(annotation) or annotation
    return isinstance(origin, type) and issubclass(origin, Mapping)


class Arguments:
    """Keyword arguments for one constructor or factory, built from ``--init``.

    Args:
        target: the class or function to call.
        init: the parsed ``--init`` object.
        namespace: the globals of the file that defines ``target`` (for string annotations).

    Attributes:
        kwargs: the arguments, objects built.

    Raises:
        ValueError: a config class refused the fields given for it (the message names the
            parameter, the class and its fields).
    """

    def __init__(self, target: Callable[..., Any], init: dict[str, Any], namespace: dict[str, Any]) -> None:
        self.target = target
        self.name = getattr(target, "__name__", repr(target))
        self.annotations = _resolved(target, namespace)
        self._labels: dict[int, str] = {}  # id of each SimpleNamespace built → its place in --init
        try:
            self.parameters = dict(inspect.signature(target).parameters)
        except (TypeError, ValueError):  # no signature to read: pass the JSON as it is
            self.parameters = {}
        self.kwargs = {k: self._value(v, self.annotations.get(k) if k in self.parameters else dict, k)
                       for k, v in init.items()}

    def _value(self, value: Any, annotation: Any, label: str) -> Any:
        if not isinstance(value, dict) or _mapping(annotation):
            return value
        cls = _config_class(annotation)
        if cls is None:
            built = types.SimpleNamespace(**{k: self._value(v, None, f"{label}.{k}") for k, v in value.items()})
            self._labels[id(built)] = label
            return built
        fields = _resolved(cls, vars(inspect.getmodule(cls)) if inspect.getmodule(cls) else {})
        kwargs = {k: self._value(v, fields.get(k), f"{label}.{k}") for k, v in value.items()}
        try:
            return cls(**kwargs)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"--init {label!r}: {cls.__name__}(**{value!r}) raised {type(exc).__name__}: {exc}; "
                             f"{cls.__name__}'s fields: {', '.join(_fields(cls)) or 'none'}") from exc

    def explain(self, exc: Exception) -> str | None:
        """What to change in ``--init`` for what the call raised, or None when there is nothing to say."""
        if isinstance(exc, AttributeError) and id(getattr(exc, "obj", None)) in self._labels:
            label = self._labels[id(exc.obj)]
            return (f"{self.name} reads {label}.{exc.name}, which --init does not give: add {json.dumps(exc.name)} to "
                    f"the {json.dumps(label)} object")
        missing = [p for p in self.parameters.values() if p.default is p.empty and p.name not in self.kwargs
                   and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        if not isinstance(exc, TypeError) or not missing:
            return None
        return "; ".join(self._needs(p.name) for p in missing)

    def _needs(self, name: str) -> str:
        annotation = self.annotations.get(name)
        cls = _config_class(annotation)
        signature = f"{self.name}({', '.join(self.parameters)})"
        if cls is not None:
            example = {f: _example(cls, f) for f in _fields(cls)[:3]}
            return (f"{signature} needs {name}, a {cls.__name__}: give its fields as a nested JSON object, e.g. "
                    f"--init '{json.dumps({name: example})}' ({cls.__name__}'s fields: {', '.join(_fields(cls))}), "
                    "or build the module in Python with --factory module:function")
        if annotation in (int, float, str, bool):
            return f"{signature} needs {name}, a {annotation.__name__}: give it in --init, e.g. '{{\"{name}\": ...}}'"
        return (f"{signature} needs {name}: give it in --init; an object such as '{{\"{name}\": {{\"FIELD\": "
                "VALUE}}' becomes a types.SimpleNamespace with those fields (a config object), or build the module "
                "in Python with --factory module:function")


def _fields(cls: type) -> list[str]:
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls) if f.init]
    try:
        return [n for n in inspect.signature(cls).parameters if n not in ("args", "kwargs")]
    except (TypeError, ValueError):
        return []


def _example(cls: type, field: str) -> Any:
    """The field's default where it is a JSON number, string or bool, else a placeholder."""
    if dataclasses.is_dataclass(cls):
        for f in dataclasses.fields(cls):
            if f.name == field and isinstance(f.default, (int, float, str, bool)):
                return f.default
    return "..."
