#!/bin/bash
# DASO against flat DDP and DDP with 4-step gradient accumulation under variability (64 nodes x 4 A100).
# Prints docs/strategies.md's "Under variability" table: mean time per iteration of 200 Monte Carlo
# iterations of each. Usage: tools/daso-variability.sh (from the repository root; B=BINARY to
# choose the binary, default target/release/parasim).
set -euo pipefail
B=${B:-./target/release/parasim}
base=scenarios/daso/resnet50-8x4-a100.toml
mk() { # sync var out
  sed "s/nodes = 8/nodes = 64/; s/sync = \"daso\"/sync = \"$1\"/; s/^iterations = 8 .*/iterations = 200/" $base > $3
  if [ -n "$2" ]; then printf '\n[variability]\n%s\n' "$2" >> "$3"; fi
}
for var in "" 'op-noise = { distribution = "lognormal", cv = 0.05 }' 'op-noise = { distribution = "lognormal", cv = 0.2 }' 'op-noise = { distribution = "lognormal", cv = 0.5 }' 'op-noise = { distribution = "lognormal", cv = 1.0 }' 'gpu-speed = { distribution = "normal", cv = 0.03 }' 'slow-ranks = { fraction = 0.01, factor = 1.2 }' 'host-interrupt = { every-ms = 100, duration-us = 10000, jitter-us = 0 }'; do
  mk daso "$var" scenarios/daso/t-daso.toml; mk allreduce "$var" scenarios/daso/t-ddp.toml
  mk allreduce "$var" scenarios/daso/t-acc.toml; sed -i 's/batch-per-device = 64/batch-per-device = 256\nmicro-batch = 64/' scenarios/daso/t-acc.toml
  d=$($B run scenarios/daso/t-daso.toml --json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["iteration_time_s"])')
  f=$($B run scenarios/daso/t-ddp.toml --json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["iteration_time_s"])')
  a=$($B run scenarios/daso/t-acc.toml --json 2>/tmp/daso/accerr | python3 -c 'import json,sys; print(json.load(sys.stdin)["iteration_time_s"]/4)' 2>/dev/null || head -3 /tmp/daso/accerr)
  V="$var" D=$d F=$f A=$a python3 -c '
import os
d,f=float(os.environ["D"]),float(os.environ["F"])
try: a=float(os.environ["A"])
except ValueError: a=float("nan")
v=os.environ["V"] or "none"
print(f"| `{v}` | {f*1e3:.3f} | {d*1e3:.3f} | {100*(1-d/f):.1f}% | {a*1e3:.3f} | {100*(1-a/f):.1f}% |")'
done
rm -f scenarios/daso/t-*.toml
