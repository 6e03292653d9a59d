"""Options shared by the commands: the model and text-pair arguments of ``patch`` and ``circuit``, comma-separated
integer lists (``--layers 0,3,5``), the seed range."""

from __future__ import annotations

from typing import Annotated

import typer

__all__ = ["Answer", "Clean", "Corrupt", "MetricName", "ModelArgument", "Wrong", "check_seed", "int_list"]

ModelArgument = Annotated[str | None, typer.Argument(help="Checkpoint directory or hub id (default: packaged MiniLM).")]
Clean = Annotated[str, typer.Option("--clean", help="The text that shows the behaviour.")]
Corrupt = Annotated[str, typer.Option("--corrupt", help="The same text changed so that it does not; as many tokens.")]
MetricName = Annotated[str | None, typer.Option("--metric", help="logit-diff (language models; needs --answer "
                                                                 "and --wrong) or similarity; default by the model's "
                                                                 "kind.")]
Answer = Annotated[str | None, typer.Option("--answer", help="logit-diff: the clean text's next token.")]
Wrong = Annotated[str | None, typer.Option("--wrong", help="logit-diff: the corrupted text's next token.")]


def check_seed(seed: int) -> int:
    """Return ``seed`` if it is an int in ``[0, 2**63)``, the range every seeded library call takes.

    Raises:
        typer.BadParameter: the message names the value and the range.
    """
    if not 0 <= seed < 2**63:
        raise typer.BadParameter(f"{seed} is not an int in [0, 2**63)", param_hint="--seed")
    return seed


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
