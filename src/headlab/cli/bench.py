"""``headlab bench``: the performance suite, every peer timed side by side in one run.

``--out FILE`` stores the run as its device's latest (the JSON beside FILE) and regenerates
FILE from it: ``headlab bench --out benchmarks/RESULTS.md`` is how RESULTS.md is written.
``--json`` prints the run as one JSON document on stdout (tables and progress go to stderr).
``--area NAME`` (repeatable) runs only those areas, for a look at one of them; RESULTS.md records
whole runs, so it does not go with ``--out``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from headlab.cli.loading import load_model, quiet_loading
from headlab.cli.output import output_file, staged_files

SHOWN = ("case", "contender", "peer", "ratio", "goal", "met", "rate", "noise")  # the full table is in --out / --json


def bench(
    model: Annotated[
        str | None,
        typer.Argument(help="Checkpoint directory or hub id for the real-model areas; default: the packaged MiniLM. "
                       "Loaded in the run's dtype and device before anything is timed."),
    ] = None,
    device: Annotated[
        str, typer.Option("--device", help="cpu (float32) or cuda (bfloat16, adds 4k positions).")
    ] = "cpu",
    quick: Annotated[
        bool, typer.Option("--quick", help="Smoke-run budget: fewer rounds and sizes, a corpus slice.")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON document with every ratio on stdout.")
    ] = False,
    threads: Annotated[
        int | None,
        typer.Option("--threads", min=1, max=os.cpu_count() or 1,
                     help="torch CPU threads for the run, at most this machine's CPUs (default: torch's choice). On "
                     "a shared machine, fewer threads than free cores keep workers from waiting on each other."),
    ] = None,
    only: Annotated[
        list[str] | None,
        typer.Option("--area", help="Run only this area (repeat the option for more), e.g. --area circuits; an "
                     "unknown name is refused with the list. Not with --out: RESULTS.md records whole runs."),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Markdown results file to regenerate (e.g. benchmarks/RESULTS.md); the JSON "
                     "goes beside it and keeps the other device's latest run."),
    ] = None,
) -> None:
    """Time headlab against nn.MultiheadAttention, Hugging Face and the raw floor, with the machine's ceilings.

    Exits with status 2 on a bad --device or --area, --area with --out, --device cuda where CUDA is not
    available, an --out that cannot be written or whose JSON file is not a headlab bench results file,
    or a MODEL that does not load (all checked before anything is timed);
    1 when interrupted (--out and its JSON left as they were), or when an area raised: the run goes on
    with the other areas, and --out records it with the error.
    """
    import json
    import shutil
    from contextlib import nullcontext

    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from headlab.bench import check_device, read_results, run_suite, write_results
    from headlab.bench.plan import plan_for
    from headlab.bench.results import TABLE_HEADERS, json_path, table_rows
    from headlab.bench.suite import check_areas

    console = Console(stderr=as_json)
    try:
        check_device(device)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--device") from None
    try:
        check_areas(only)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--area") from None
    if only and out is not None:
        raise typer.BadParameter("--area runs part of the suite and --out records whole runs; drop one of them",
                                 param_hint="--area")
    if out is not None:  # refuse a results file that cannot be updated before the run, not after it
        if json_path(out) == out:
            raise typer.BadParameter(f"{str(out)!r} is the JSON file; expected the Markdown file, e.g. "
                                     "benchmarks/RESULTS.md (the JSON goes beside it)", param_hint="--out")
        for path in (out, json_path(out)):
            output_file(path, example="benchmarks/RESULTS.md")
        try:
            read_results(out)
        except UnicodeDecodeError:
            raise typer.BadParameter(f"{str(json_path(out))!r} is not UTF-8 text; expected a headlab bench results "
                                     "file", param_hint="--out") from None
        except ValueError as err:
            raise typer.BadParameter(str(err), param_hint="--out") from None
    import torch

    if threads is not None:
        torch.set_num_threads(threads)  # recorded in RESULTS.md's machine table
    command = " ".join(["headlab bench", *([model] if model is not None else []), f"--device {device}",
                        *(["--quick"] if quick else []),
                        *([f"--threads {threads}"] if threads is not None else []),
                        *(f"--area {name}" for name in only or ()),
                        *(["--json"] if as_json else []), *([f"--out {out}"] if out is not None else [])])
    quiet_loading()  # the packaged model too loads without transformers' "Loading weights" bar
    # In the run's dtype and on its device, before anything is timed: one that does not load ends the command.
    loaded = None if model is None else load_model(model, dtype=plan_for(device, quick=quick).torch_dtype,
                                                   device=device)
    with nullcontext() if out is None else staged_files(out.parent, shown=out) as work:
        result = run_suite(device=device, quick=quick, progress=True, command=command, model=loaded, areas=only)
        if work is not None and out is not None:  # staged where out is given
            if json_path(out).exists():  # write_results keeps the other device's run from the JSON beside it
                shutil.copyfile(json_path(out), work / json_path(out).name)
            write_results(result, work / out.name)
    ceiling = result.ceilings.matmul_flops_per_s
    console.print(f"ceilings: {result.ceilings.dtype} matmul {ceiling / 1e9:,.1f} GFLOP/s, "
                  f"copy {result.ceilings.copy_bytes_per_s / 1e9:,.1f} GB/s")
    shown = [TABLE_HEADERS.index(h) for h in SHOWN]
    for area in result.areas:
        table = Table(title=area.title)
        for header in SHOWN:
            table.add_column(header, justify="right" if header in ("ratio", "noise") else "left")
        for cells, row in zip(table_rows(area, ceiling), area.rows):
            met = row.met(ceiling)
            style = None if met is None else ("green" if met else "red")
            table.add_row(*(escape(cells[i]) for i in shown), style=style)
        console.print(table)
        for note in area.notes:
            console.print(escape(note))
    goals = result.goals()
    console.print(f"goals: {sum(met for _, _, met in goals)} of {len(goals)} met; {result.seconds:.0f} s")
    if out is not None:
        console.print(f"wrote {escape(str(out))} and {escape(str(json_path(out)))}")
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=1))
    failed = result.failed()
    for area in failed:
        console.print(f"[red]area {escape(area.name)} failed[/red]: {escape(area.error or '')}")
    if failed:
        raise typer.Exit(1)
