"""Building the module to audit from ``PATH.py:ClassName``, ``--init`` arguments and ``--factory``.

The file is executed (imported under a private module name, with its folder on ``sys.path``
while it loads, so that it can import its neighbours): only audit files you trust. The class is
constructed with the ``--init`` keyword arguments, a JSON object whose nested objects become
config objects (``headlab.audit.arguments``); or ``--factory module:function`` builds the module
in Python, called with the same arguments, and must return an instance of the class.
Problems with the arguments (a bad spec, a missing file, class or factory, constructor arguments
that are not JSON or that the class refuses) are ``LoadError``; the user's code raising anything
else while it loads is an ``AuditError`` of kind ``raised``.
"""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

from torch import nn

from headlab.audit.arguments import Arguments
from headlab.audit.errors import AuditError

__all__ = ["LoadError", "load_module", "parse_factory", "parse_init", "parse_spec"]

_NAMES = itertools.count()  # each load gets a fresh module name: two files called layer.py never collide


class LoadError(ValueError):
    """The spec, the file, the class, the factory or the constructor arguments are not usable (the message says
    which)."""


def parse_spec(spec: str) -> tuple[Path, str]:
    """Split ``"PATH.py:ClassName"``.

    Raises:
        LoadError: no ``:``, a path not ending in ``.py``, or a class name that is not an identifier.
    """
    path, sep, name = spec.rpartition(":")
    if not sep or not path.endswith(".py") or not name.isidentifier():
        raise LoadError(f"{spec!r} is not PATH.py:ClassName (e.g. my_layer.py:MyAttention)")
    return Path(path), name


def parse_factory(text: str) -> tuple[str, str]:
    """Split ``"module:function"`` (module: a dotted module name or a ``.py`` file).

    Raises:
        LoadError: no ``:``, an empty module, or a function name that is not an identifier.
    """
    module, sep, function = text.rpartition(":")
    if not sep or not module or not function.isidentifier():
        raise LoadError(f"--factory {text!r} is not module:function (e.g. my_layer:make_attention, or "
                        "my_layer.py:make_attention)")
    return module, function


def parse_init(text: str | None) -> dict[str, Any]:
    """Constructor keyword arguments from a JSON object (None: no arguments).

    Raises:
        LoadError: not valid JSON, or not a JSON object.
    """
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise LoadError(f"{text!r} is not valid JSON ({exc.msg} at character {exc.pos}); expected an object such "
                        'as \'{"embed_dim": 64, "num_heads": 8}\'') from None
    if not isinstance(value, dict):
        raise LoadError(f"{text!r} is JSON {type(value).__name__}; expected an object of constructor keyword "
                        'arguments such as \'{"embed_dim": 64}\'')
    return value


@contextmanager
def _on_path(folder: Path) -> Iterator[None]:
    entry = str(folder.resolve())
    sys.path.insert(0, entry)
    try:
        yield
    finally:
        sys.path.remove(entry)


def _execute(path: Path, wanted: str) -> ModuleType:
    """Run ``path`` as a fresh private module, its folder on ``sys.path`` while it loads."""
    module_name = f"_headlab_audit_user_{next(_NAMES)}"
    loader_spec = importlib.util.spec_from_file_location(module_name, path)
    if loader_spec is None or loader_spec.loader is None:  # not a file Python knows how to load
        raise LoadError(f"{path} cannot be loaded as a Python module")
    loader = loader_spec.loader
    user = importlib.util.module_from_spec(loader_spec)
    sys.modules[module_name] = user  # dataclasses and pickling look modules up here
    try:
        with _on_path(path.parent):
            loader.exec_module(user)
    except SystemExit as exc:  # sys.exit() or exit() at top level: it must not end headlab in silence
        sys.modules.pop(module_name, None)
        raise AuditError("raised", f"{path} called sys.exit({exc.code!r}) while being imported; expected a file "
                                   f"that defines {wanted} and returns") from exc
    except Exception as exc:  # the user's code
        sys.modules.pop(module_name, None)
        raise AuditError("raised", f"executing {path} raised {type(exc).__name__}: {exc}") from exc
    return user


def _factory(text: str, path: Path, user: ModuleType) -> Callable[..., Any]:
    """The function named by ``--factory``: in the target file itself, another ``.py`` file, or a module."""
    module, function = parse_factory(text)
    if module.endswith(".py"):
        where = Path(module)
        if not where.is_file():
            raise LoadError(f"--factory {text!r}: {where} is not a file")
        found = user if where.resolve() == path.resolve() else _execute(where, function)
    elif module == path.stem:
        found = user
    else:
        try:
            with _on_path(path.parent):
                found = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            raise LoadError(f"--factory {text!r}: no module {exc.name!r} next to {path} or among the installed "
                            "packages") from None
        except Exception as exc:  # the user's code
            raise AuditError("raised", f"importing {module} for --factory raised {type(exc).__name__}: {exc}") \
                from exc
    make = getattr(found, function, None)
    if not callable(make) or isinstance(make, type):
        functions = sorted(n for n, v in vars(found).items() if callable(v) and not isinstance(v, type)
                           and not n.startswith("_"))
        raise LoadError(f"--factory {text!r}: {module} defines no function {function!r}; functions in it: "
                        f"{', '.join(functions) or 'none'}")
    return make


def load_module(spec: str, *, init: dict[str, Any] | None = None, factory: str | None = None) -> nn.Module:
    """Execute ``PATH.py`` and build ``ClassName`` from ``init`` (or with ``factory``).

    Args:
        spec: ``"PATH.py:ClassName"``.
        init: keyword arguments for the constructor (or the factory); nested JSON objects become
            config objects (``headlab.audit.arguments``).
        factory: ``"module:function"`` returning the module, or None to call the class itself.

    Returns:
        The constructed module.

    Raises:
        LoadError: a bad spec, a missing file, class or factory, a class that is not an
            nn.Module, a factory that returns something else, or arguments the constructor refuses
            (TypeError or ValueError, or a config field it reads and ``init`` lacks); the message
            names the fix.
        AuditError: ``raised``: executing the file or constructing the class raised anything else,
            or called ``sys.exit``.
    """
    path, name = parse_spec(spec)
    if not path.is_file():
        raise LoadError(f"{path} is not a file")
    user = _execute(path, name)
    cls = getattr(user, name, None)
    if cls is None:
        found = sorted(n for n, v in vars(user).items() if isinstance(v, type) and issubclass(v, nn.Module))
        raise LoadError(f"{path} defines no {name!r}; nn.Module classes in it: {', '.join(found) or 'none'}")
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise LoadError(f"{name} in {path} is a {type(cls).__name__}, not a torch.nn.Module subclass")
    target = cls if factory is None else _factory(factory, path, user)
    try:
        arguments = Arguments(target, init or {}, vars(user))
    except ValueError as exc:
        raise LoadError(str(exc)) from None
    module = _build(arguments, path, "--init" if factory is None else f"--init, --factory {factory}")
    if not isinstance(module, nn.Module) or not (isinstance(module, cls) or type(module).__name__ == name):
        raise LoadError(f"--factory {factory!r} returned a {type(module).__name__}; expected an instance of {name}, "
                        "the class named in PATH.py:ClassName")
    return module


def _build(arguments: Arguments, path: Path, options: str) -> object:
    call = f"{arguments.name}(**{arguments.kwargs!r})"
    try:
        return arguments.target(**arguments.kwargs)
    except SystemExit as exc:
        raise AuditError("raised", f"{call} in {path} called sys.exit({exc.code!r}) while being built; expected a "
                                   "constructor that returns") from exc
    except Exception as exc:  # the user's code: refused arguments are the user's to fix
        fix = arguments.explain(exc)
        if fix is not None:
            raise LoadError(f"{call} raised {type(exc).__name__}: {exc}; {fix}") from exc
        if isinstance(exc, (TypeError, ValueError)):
            raise LoadError(f"{call} raised {type(exc).__name__}: {exc} (check {options})") from exc
        raise AuditError("raised", f"{call} raised {type(exc).__name__}: {exc}") from exc
