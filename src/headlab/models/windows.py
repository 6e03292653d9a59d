"""Windowed attention (Swin: Liu et al. 2021, and the models built like it): where each position of a window lies
on the patch grid of its stage.

A windowed block pads its stage's grid at the bottom and right to a multiple of the window side, rolls it up and left
by its shift (shifted windows, in alternate blocks), cuts it into windows of ``side × side`` positions (windows row
by row, positions row by row in each) and runs its attention on ``(batch × windows, head, side², side²)``. Everything
is read from the model on one forward: each block's stage grid (the ``input_dimensions`` it is called with), and its
window side and shift after the call (a block whose grid is no larger than its window takes the grid whole, unshifted;
transformers' Swin keeps that for every later call, so the windows of a forward are the block's state after it).

Axis legend:
    windowed   (batch · window, head, side², side²)   a windowed site's pattern as its attention computes it
               (batch · window, head, side², d)       its z, result, q, k, v
    grid       (batch, head, patch, patch)             the same scattered on its stage's grid, patches row by row
               (batch, head, patch, d)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from headlab.models.site import AttentionSite

__all__ = ["Windows", "window_geometry"]


@dataclass(frozen=True)
class Windows:
    """The windows of one windowed attention site on one input size.

    Attributes:
        rows, columns: the stage's patch grid (real patches; padding excluded).
        side: the window's side, in patches.
        shift: how far the grid is rolled up and left before it is cut into windows, in patches.
    """

    rows: int
    columns: int
    side: int
    shift: int

    @property
    def padded(self) -> tuple[int, int]:
        """The grid padded at the bottom and right to a multiple of ``side``: ``(rows, columns)``."""
        return -(-self.rows // self.side) * self.side, -(-self.columns // self.side) * self.side

    @property
    def n_windows(self) -> int:
        rows, columns = self.padded
        return (rows // self.side) * (columns // self.side)

    def index(self) -> Tensor:
        """``(n_windows, side²)`` long: the grid position (``row · columns + column``) of each window's positions,
        -1 where the window holds padding (no patch)."""
        rows, columns = self.padded
        a = torch.arange(self.side)
        # window (i, j), place (a, b) holds the rolled grid's (i·side + a, j·side + b): the padded grid's that + shift
        r = (torch.arange(rows // self.side)[:, None] * self.side + a[None, :] + self.shift) % rows  # (window row, a)
        c = (torch.arange(columns // self.side)[:, None] * self.side + a[None, :] + self.shift) % columns
        r4, c4 = r[:, None, :, None], c[None, :, None, :]  # (window row, window column, a, b)
        position = torch.where((r4 < self.rows) & (c4 < self.columns), r4 * self.columns + c4, -1)
        return position.reshape(self.n_windows, self.side * self.side)

    def scatter(self, x: Tensor, *, square: bool) -> Tensor:
        """A windowed tensor laid on the stage's grid, row by row.

        Padding is no patch: a padded query's row is dropped, and so is the weight a query puts on a padded key (a
        zero vector after the block's norm, which the model does not mask), so a row of a window that holds padding
        sums to less than 1 over the patches. Weights outside a query's window are 0.

        Args:
            x: a pattern ``(batch · window, head, side², side²)`` (``square``), or a z, result, q, k or v
                ``(batch · window, head, side², d)``.
            square: whether ``x`` is a pattern (both its last axes are window positions).

        Returns:
            ``(batch, head, patch, patch)`` or ``(batch, head, patch, d)``, in ``x``'s dtype and device.

        Raises:
            ValueError: ``x``'s leading axes are not whole images of these windows.
        """
        area, n = self.side * self.side, self.rows * self.columns
        if x.dim() != 4 or x.shape[0] % self.n_windows or x.shape[2] != area or (square and x.shape[3] != area):
            raise ValueError(f"a windowed tensor of shape {tuple(x.shape)} does not hold images of {self.n_windows} "
                             f"windows of {self.side}×{self.side} positions ({self.rows}×{self.columns} patches)")
        batch, heads = x.shape[0] // self.n_windows, x.shape[1]
        index = self.index().to(x.device).reshape(-1)  # (window · place,)
        real = index >= 0
        per_image = x.reshape(batch, self.n_windows, heads, *x.shape[2:]).transpose(1, 2)  # (batch, head, window, …)
        if not square:
            out = x.new_zeros(batch, heads, n, x.shape[3])
            out[:, :, index[real]] = per_image.reshape(batch, heads, -1, x.shape[3])[:, :, real]
            return out
        query = index.reshape(self.n_windows, area, 1).expand(-1, -1, area)
        key = index.reshape(self.n_windows, 1, area).expand(-1, area, -1)
        pairs = ((query >= 0) & (key >= 0)).reshape(-1)
        target = (query * n + key).reshape(-1)[pairs]  # each (query, key) of one window: one cell of the grid's square
        out = x.new_zeros(batch, heads, n * n)
        out[:, :, target] = per_image.reshape(batch, heads, -1)[:, :, pairs]
        return out.reshape(batch, heads, n, n)


def _block(model: nn.Module, site: AttentionSite) -> nn.Module | None:
    """The module holding ``site``'s attention when it cuts its input into windows (it has an int ``window_size``
    and ``shift_size``: Swin's, Swinv2's and Donut's layers), else None."""
    parent = site.name.rpartition(".")[0]
    block = model.get_submodule(parent) if parent else model
    return block if all(isinstance(getattr(block, name, None), int) for name in ("window_size", "shift_size")) \
        else None


def window_geometry(model: nn.Module, sites: Sequence[AttentionSite], run: Any) -> list[Windows | None]:
    """Each site's windows on one forward, read from the model: ``run()`` runs the forward (one image suffices).

    Args:
        model: the model itself.
        sites: its attention sites, in layer order.
        run: a function of no argument that runs ``model`` once on the input whose windows are wanted.

    Returns:
        Per site its ``Windows``, or None for a site whose attention is not windowed.

    Raises:
        ValueError: a windowed block called without its grid's ``(height, width)`` (``input_dimensions``), or not
            called in the forward.
    """
    blocks = {site.layer: block for site in sites if (block := _block(model, site)) is not None}
    grids: dict[int, tuple[int, int]] = {}
    windows: dict[int, tuple[int, int]] = {}
    handles = []

    def watch(layer: int, block: nn.Module) -> None:
        def before(_: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            size = kwargs.get("input_dimensions", args[1] if len(args) > 1 else None)
            if not (isinstance(size, (tuple, list)) and len(size) == 2):
                raise ValueError(f"layer {layer}'s windowed block {type(block).__name__} was called without its grid's "
                                 f"(height, width) (input_dimensions); got {size!r}")
            grids[layer] = (int(size[0]), int(size[1]))

        def after(module: Any, *_: Any) -> None:  # the block may shrink its window to its grid during the call
            windows[layer] = (int(module.window_size), int(module.shift_size))

        handles.append(block.register_forward_pre_hook(before, with_kwargs=True))
        handles.append(block.register_forward_hook(after))

    for layer, block in blocks.items():
        watch(layer, block)
    try:
        run()
    finally:
        for handle in handles:
            handle.remove()
    missing = sorted(set(blocks) - set(windows))
    if missing:
        raise ValueError(f"the windowed blocks of layers {missing} did not run in the forward")
    return [Windows(*grids[s.layer], *windows[s.layer]) if s.layer in blocks else None for s in sites]
