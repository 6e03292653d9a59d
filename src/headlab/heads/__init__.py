"""Heads of a loaded model, addressed as (layer, head): one selection type (``selection``), one
per-head result type (``table``), interventions persistent (mask, scale, mean-ablate, restore)
and scoped to a ``with`` block (masked, scaled, mean_ablated, patched, windowed), physical pruning, and
saving the result."""

from headlab.heads.interventions import mask, mean_ablate, restore, scale, summary
from headlab.heads.persist import save
from headlab.heads.prune import prune
from headlab.heads.scoped import intervening, masked, mean_ablated, patched, scaled, windowed
from headlab.heads.selection import Heads, HeadSelection, head_label, resolve
from headlab.heads.table import HeadTable

__all__ = ["HeadTable", "Heads", "HeadSelection", "resolve", "head_label", "intervening", "mask", "masked",
           "mean_ablate", "mean_ablated", "patched", "prune", "restore", "save", "scale", "scaled", "summary",
           "windowed"]
