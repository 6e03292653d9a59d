"""AttentionConfig's constructor as type checkers read it: the ``__init__`` written for them (the derived sizes
take None there, the fields are typed as what they hold) is the one the dataclass makes at run time."""

from __future__ import annotations

import ast
import dataclasses
import inspect

from headlab.layer import AttentionConfig
from headlab.layer import config as config_module


def _checker_init() -> ast.FunctionDef:
    tree = ast.parse(inspect.getsource(config_module))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "AttentionConfig")
    block = next(n for n in cls.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    return next(n for n in block.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")


def test_the_checkers_constructor_is_the_dataclasss() -> None:
    init = _checker_init()
    assert not init.args.args[1:] and not init.args.vararg and not init.args.kwarg  # keyword-only, as kw_only=True
    written = {a.arg: (ast.unparse(a.annotation), ast.literal_eval(d) if d is not None else dataclasses.MISSING)
               for a, d in zip(init.args.kwonlyargs, init.args.kw_defaults)}
    fields = dataclasses.fields(AttentionConfig)
    assert list(written) == [f.name for f in fields]
    for f in fields:
        annotation, default = written[f.name]
        assert default == f.default, f.name  # None for a derived size: the field's default is None too
        # the constructor takes what the field holds, or None where __post_init__ derives the value
        assert annotation in (f.type, f"{f.type} | None"), f.name
        assert (annotation == f"{f.type} | None") == (f.default is None and "None" not in f.type), f.name
    assert list(inspect.signature(AttentionConfig).parameters) == list(written)


def test_a_derived_size_passed_as_none_is_derived() -> None:
    c = AttentionConfig(d_model=64, n_heads=8, d_head=None, n_kv_heads=None, kv_head_of=None, d_head_v=None,
                        kdim=None, vdim=None, rotary_dim=None)
    assert (c.d_head, c.n_kv_heads, c.kv_head_of, c.d_head_v, c.kdim, c.vdim, c.rotary_dim) == (
        8, 8, tuple(range(8)), 8, 64, 64, 8)
    assert c == AttentionConfig(d_model=64, n_heads=8)
