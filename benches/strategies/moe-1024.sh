#!/usr/bin/env bash
# Wall time of one DeepSeek-V3 iteration on 1,024 H100s under `flow` (scenarios/moe/
# deepseek-v3-1024.toml), for every pipeline schedule and MoE dispatcher parasim runs, and
# Qwen3-235B-A22B in the same layout and with the MoE overlap (issue 37's speed target: under
# 1 s each).
# Usage: benches/strategies/moe-1024.sh [PARASIM] [RUNS]   (default: target/release/parasim, 3)
# Prints, per variant, the simulated iteration, the engine's events, and the fastest and
# slowest wall time of RUNS runs.
set -euo pipefail
parasim=${1:-target/release/parasim}
runs=${2:-3}
scenario=scenarios/moe/deepseek-v3-1024.toml
variants=(
  "1f1b|"
  "interleaved (virtual 2)|--set parallelism.virtual-stages=2"
  "gpipe|--set parallelism.schedule=gpipe"
  "zb-h1|--set parallelism.schedule=zb-h1"
  "zb-v|--set parallelism.schedule=zb-v --set parallelism.virtual-stages=2"
  "dualpipe (global batch 2048)|--set parallelism.schedule=dualpipe --set parallelism.virtual-stages=2 --set workload.global-batch=2048"
  "1f1b, global batch 2048|--set workload.global-batch=2048"
  "Qwen3-235B-A22B, 1f1b|--set workload.model=qwen3-235b-a22b"
  "Qwen3-235B-A22B, tensor 2 x expert 32, interleaved, moe-overlap|--set workload.model=qwen3-235b-a22b --set parallelism.moe-overlap=true --set parallelism.virtual-stages=2 --set workload.recompute=selective --set parallelism.tensor=2 --set parallelism.expert=32"
  "all-gather dispatcher|--set parallelism.moe-dispatcher=all-gather"
  "deepep dispatcher|--set parallelism.moe-dispatcher=deepep"
)
printf '| variant | iteration | events | wall (min-max of %s) |\n|---|---|---|---|\n' "$runs"
for entry in "${variants[@]}"; do
  name=${entry%%|*}
  args=${entry#*|}
  times=()
  for _ in $(seq "$runs"); do
    start=$(date +%s.%N)
    # shellcheck disable=SC2086
    out=$("$parasim" run "$scenario" $args)
    end=$(date +%s.%N)
    times+=("$(echo "$end - $start" | bc)")
  done
  iteration=$(echo "$out" | awk '/^iteration/ {print $2" "$3; exit}')
  events=$(echo "$out" | awk '/^engine/ {print $4; exit}')
  sorted=$(printf '%s\n' "${times[@]}" | sort -n)
  printf '| %s | %s | %s | %.2f-%.2f s |\n' "$name" "$iteration" "$events" "$(echo "$sorted" | head -1)" "$(echo "$sorted" | tail -1)"
done
