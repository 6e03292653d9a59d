"""Options shared by the commands: the model and text-pair arguments of ``patch`` and ``circuit``, comma-separated
integer lists (``--heads 0,3,5``), the head selection of ``--layers`` and ``--heads`` (layers by index or by
name: ``--layers 0,3``, ``--layers encoder``, ``--layers 'decoder.blocks.*.cross_attn'``), the seed range."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from headlab.layer.selection import Heads

__all__ = ["LAYERS_HELP", "Answer", "Clean", "Corrupt", "MetricName", "ModelArgument", "Wrong", "check_seed",
           "head_selection", "int_list", "memory_size"]

ModelArgument = Annotated[str | None, typer.Argument(help="Checkpoint directory or hub id (default: packaged MiniLM).")]
Clean = Annotated[str, typer.Option("--clean", help="The text that shows the behaviour (an image model: an image "
                                                    "file).")]
Corrupt = Annotated[str, typer.Option("--corrupt", help="The same text changed so that it does not; as many tokens "
                                                        "(an image model: another image file).")]
MetricName = Annotated[str | None, typer.Option("--metric", help="logit-diff (language models; needs --answer "
                                                                 "and --wrong) or similarity; default by the model's "
                                                                 "kind.")]
Answer = Annotated[str | None, typer.Option("--answer", help="logit-diff: the clean text's next token.")]
Wrong = Annotated[str | None, typer.Option("--wrong", help="logit-diff: the corrupted text's next token.")]
LAYERS_HELP = ("by index (0,1,5) or name: an address (encoder.blocks.3.attn), a stack (encoder, decoder, vision) or a "
               "pattern ('decoder.blocks.*.cross_attn')")


def check_seed(seed: int) -> int:
    """Return ``seed`` if it is an int in ``[0, 2**63)``, the range every seeded library call takes.

    Raises:
        typer.BadParameter: the message names the value and the range.
    """
    if not 0 <= seed < 2**63:
        raise typer.BadParameter(f"{seed} is not an int in [0, 2**63)", param_hint="--seed")
    return seed


_UNITS = {"": 1, "B": 1, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "KB": 10**3, "MB": 10**6, "GB": 10**9}


def memory_size(text: str, *, option: str) -> int:
    """Parse a size in bytes: ``"512MiB"``, ``"1.5GiB"``, ``"800MB"`` or a plain number of bytes.

    Raises:
        typer.BadParameter: not a positive number with one of the units B, KiB, MiB, GiB, KB, MB, GB.
    """
    number = text.strip().rstrip("BbIiKkMmGg")
    unit = text.strip()[len(number):].upper()
    try:
        value = float(number) * _UNITS[unit]
    except (KeyError, ValueError):
        value = 0.0
    if not value >= 1:
        raise typer.BadParameter(f"{text!r} is not a size (expected e.g. 512MiB, 2GiB or a number of bytes)",
                                 param_hint=option)
    return int(value)


def int_list(text: str, *, option: str, minimum: int = 0, example: str = "0,3,5") -> list[int]:
    """Parse ``"0,3,5"`` into ``[0, 3, 5]``.

    Args:
        text: the option's value.
        option: the option's name, for the message (``"--layers"``).
        minimum: the smallest value allowed (0: non-negative, 1: positive).
        example: a valid value, shown in the message.

    Raises:
        typer.BadParameter: an item is not an int ≥ ``minimum``, or is listed twice; the message
            names the item, the whole value and what was expected.
    """
    kind = "a positive int" if minimum == 1 else f"an int ≥ {minimum}"
    values: list[int] = []
    for part in text.split(","):
        part = part.strip()
        digits = part[1:] if part.startswith("-") else part
        if not (digits.isascii() and digits.isdigit()) or int(part) < minimum:
            raise typer.BadParameter(f"{part!r} is not {kind} (got {option}={text!r}; expected e.g. {example})",
                                     param_hint=option)
        if int(part) in values:
            raise typer.BadParameter(f"{part} is listed more than once (got {option}={text!r})", param_hint=option)
        values.append(int(part))
    return values


def head_selection(layers: str | None, heads: str | None) -> Heads:
    """The selection of ``--layers`` and ``--heads``: layers by index or by name (an address, a stack, a
    pattern: resolved against the model, which says which names it has), heads by index.

    Raises:
        typer.BadParameter: an empty item, a negative index or a repeated one (``int_list``'s messages).
    """
    from headlab.layer.selection import Heads  # imports torch: not at the CLI's import

    return Heads(layers=None if layers is None else _layer_list(layers),
                 heads=None if heads is None else int_list(heads, option="--heads"))


def _layer_list(text: str) -> list[int | str]:
    items: list[int | str] = []
    expected = f"got --layers={text!r}; expected e.g. 0,3,5 or encoder"
    for part in (p.strip() for p in text.split(",")):
        index = part.isascii() and part.lstrip("-").isdigit()
        if not part or (index and part.startswith("-")):
            raise typer.BadParameter(f"{part!r} is not a layer index ≥ 0 or a name ({expected})", param_hint="--layers")
        item = int(part) if index else part
        if item in items:
            raise typer.BadParameter(f"{part} is listed more than once (got --layers={text!r})", param_hint="--layers")
        items.append(item)
    return items
