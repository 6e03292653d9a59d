"""Which heads: the one selection type of headlab and its one resolver (defined in
``headlab.layer.selection``, below every room that takes a selection; see its docstring for the forms)."""

from headlab.layer.selection import Heads, HeadSelection, head_label, resolve

__all__ = ["HeadSelection", "Heads", "head_label", "resolve"]
