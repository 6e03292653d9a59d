"""``headlab bench``: the performance suite, every peer timed side by side in one run.

    timing.py      interleaved rounds, medians, quartiles; CUDA events on the GPU
    plan.py        sizes and budgets per device, full or --quick
    ceilings.py    the machine described; its matmul FLOP/s and copy bandwidth measured
    layer.py       headlab's own layer, forward and forward + backward vs raw floor and
                   nn.MultiheadAttention; grouped-query vs its floor
    inspection.py  one head's pattern, every head's pattern, head outputs vs the plain forward
    decode.py      decoding tokens/s with the kv cache vs a raw floor
    models.py      headlab's attention attached to the default model and a tiny causal one vs
                   transformers' sdpa and eager: nothing inspected, every pattern, one head's pattern
    long_context.py every head's statistics of one 4k–32k text in row blocks vs the plain forward, a bound and
                   transformers' eager output_attentions=True (predicted out of memory where it cannot fit)
    capture.py     capture vs the plain Hugging Face forward; accumulators; importance
    patching.py    attribution patching (AtP) vs exact activation patching, on the default model
                   and a tiny causal one: speed and rank correlation
    circuits.py    edge attribution (EAP, EAP-IG) and exact edge patching (on a sample) vs one forward +
                   backward of the default model at 128 tokens: speed, rank correlation, peak memory
    pruning.py     half the heads pruned vs the full, masked and plain models
    distributed.py the Ray engine: 2 workers of one thread vs 1, analyze's accumulators, merged
                   results compared (skipped without headlab[ray])
    memory.py      peak memory of a call (the process's resettable peak RSS on Linux; CUDA's allocator)
    records.py     Comparison, Area, SuiteResult (JSON round trip)
    results.py     benchmarks/RESULTS.md and RESULTS.json
    suite.py       run_suite
    kit.py         the GPU kit: the default model in bfloat16, for a GPU machine (docs/benchmarks.md)
"""

from headlab.bench.ceilings import Ceilings, describe_machine, measure_ceilings
from headlab.bench.plan import Plan, plan_for
from headlab.bench.records import Area, Comparison, SuiteResult
from headlab.bench.results import read_results, to_markdown, write_results
from headlab.bench.suite import check_device, run_plan, run_suite
from headlab.bench.timing import Timing, time_interleaved

__all__ = [
    "Area", "Ceilings", "Comparison", "Plan", "SuiteResult", "Timing", "check_device", "describe_machine",
    "measure_ceilings", "plan_for", "read_results", "run_plan", "run_suite", "time_interleaved", "to_markdown",
    "write_results",
]
