"""A rich progress bar over an experiment's training steps (on stderr), or nothing."""

from __future__ import annotations

from types import TracebackType

__all__ = ["StepBar"]


class StepBar:
    """Counts training steps across every run of one experiment.

    Args:
        enabled: show the bar; when False every method does nothing.
        total: steps the experiment will take in all.
        description: the experiment's name.
    """

    def __init__(self, *, enabled: bool, total: int, description: str) -> None:
        self.enabled, self.total, self.description = enabled, total, description

    def __enter__(self) -> StepBar:
        if self.enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("steps"), TimeElapsedColumn(), console=Console(stderr=True),
                                 transient=True)
            self._bar.__enter__()
            self._task = self._bar.add_task(self.description, total=self.total)
        return self

    def advance(self, steps: int = 1, *, run: str | None = None) -> None:
        """Count ``steps`` more steps; ``run`` names the run now training."""
        if self.enabled:
            description = self.description if run is None else f"{self.description}: {run}"
            self._bar.update(self._task, advance=steps, description=description)

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if self.enabled:
            self._bar.__exit__(kind, error, traceback)
