#!/usr/bin/env python3
"""parasim's flow network against SimGrid 3.32, side by side on the same flows.

Three cases (issue 34): a random permutation on a 1024-host Cray Cascade dragonfly, an
all-to-all of 1 MiB among 256 hosts of a k = 16 fat-tree (65,280 flows at once, each its own
stream), and the 1 GiB ring all-reduce with per-host step dependencies on the 1024-host k = 16
fat-tree. SimGrid runs plain max-min (CM02 without cross-traffic) with each flow's route latency
before it enters (`--pure`), which is what parasim computes; the script checks that both give
the same simulated time. The two tools run alternately, RUNS times each, on the same machine.

Times: "sim" is each tool's own clock around its simulation (parasim's `simulated ... in X ms`
for traffic; SimGrid's `run_wall_s`, after its platform and flows are built); "process" is the
whole command's wall time (parasim's includes reading the scenario and building the topology
and, for the ring, the collective command's table; SimGrid's includes building its platform).
The ring has no parasim-side simulation clock, so its "sim" is the process time.

usage: benches/simgrid/compare.py [--runs N] [--parasim PATH] [--case NAME ...]
needs: g++ and Debian's libsimgrid-dev (apt-get install libsimgrid-dev g++), a release build.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CM02 = ["--cfg=network/model:CM02", "--cfg=network/crosstraffic:0", "--log=root.thres:critical"]

DRAGONFLY = """[cluster]
nodes = 1024
gpus-per-node = 1
device = "a100-sxm4-80gb"

[cluster.network]
topology = "cascade-dragonfly"
simgrid = "8,1;4,1;8,1;4"
link-bandwidth = "100 Gb/s"
link-latency = "1 us"
"""

FAT_TREE_256 = """[cluster]
nodes = 256
gpus-per-node = 1
device = "a100-sxm4-80gb"

[cluster.network]
topology = "fat-tree"
radix = 16
link-bandwidth = "100 Gb/s"
link-latency = "1 us"
"""


def build_flowsim(work):
    """Compiles flowsim.cpp against the installed SimGrid; a clear error if it cannot."""
    if shutil.which("g++") is None:
        sys.exit("compare.py: g++ not found (apt-get install g++ libsimgrid-dev)")
    if not os.path.exists("/usr/include/simgrid/s4u.hpp"):
        sys.exit("compare.py: SimGrid headers not found (apt-get install libsimgrid-dev)")
    binary = os.path.join(work, "flowsim")
    subprocess.run(["g++", "-O2", "-std=c++17", "-o", binary, os.path.join(HERE, "flowsim.cpp"), "-lsimgrid"],
                   check=True)
    version = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "libsimgrid-dev"], capture_output=True,
                             text=True).stdout or "unknown"
    return binary, version


def flows_file(parasim, cluster, pattern, size, path):
    """The pattern's flows as parasim draws them (`traffic --csv`), as src,dst,bytes rows."""
    out = subprocess.run([parasim, "traffic", "--cluster", cluster, *pattern, "--size", size, "--csv"],
                         capture_output=True, text=True, check=True).stdout
    with open(path, "w") as f:
        for line in out.splitlines():
            if line.startswith("src"):
                continue
            src, dst, nbytes = line.split(",")[:3]
            f.write(f"{src},{dst},{nbytes}\n")


def timed(cmd):
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"compare.py: {' '.join(cmd)} failed:\n{r.stderr[-2000:]}")
    return r.stdout, r.stderr, wall


def run_parasim_traffic(parasim, cluster, flows):
    out, err, wall = timed([parasim, "traffic", "--cluster", cluster, flows, "--json"])
    sim = float(re.search(r"simulated \d+ flows in ([\d.]+) ms", err).group(1)) / 1e3
    return sim, wall, json.loads(out)["completion_time_s"]


def run_parasim_ring(parasim, cluster):
    out, _, wall = timed([parasim, "collective", "allreduce", "--cluster", cluster, "-b", "1G", "-e", "1G",
                          "--algorithm", "ring", "--fidelity", "packet-steps", "--protocol", "off", "--launch",
                          "0 s", "--host-launch", "0 s"])
    row = [line for line in out.splitlines() if line.strip().startswith("1073741824")][0]
    return wall, wall, float(row.split()[5]) * 1e-6


def run_simgrid(flowsim, topo, args):
    out, _, wall = timed([flowsim, *CM02, topo, *args, "--pure"])
    fields = dict(kv.split("=") for kv in out.split("RESULT", 1)[1].split())
    return float(fields["run_wall_s"]), wall, float(fields["sim_time_s"])


def summary(values):
    return min(values), statistics.median(values), max(values)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--parasim", default=os.path.join(ROOT, "target", "release", "parasim"))
    parser.add_argument("--case", action="append", choices=["dragonfly-permutation", "all-to-all-256", "ring-1024"])
    options = parser.parse_args()
    if not os.path.exists(options.parasim):
        sys.exit(f"compare.py: {options.parasim} not found (cargo build --release)")
    work = tempfile.mkdtemp(prefix="parasim-simgrid-")
    flowsim, version = build_flowsim(work)
    dragonfly = os.path.join(work, "dragonfly-1024.toml")
    fat_tree = os.path.join(work, "fat-tree-256.toml")
    open(dragonfly, "w").write(DRAGONFLY)
    open(fat_tree, "w").write(FAT_TREE_256)
    perm = os.path.join(work, "permutation.csv")
    a2a = os.path.join(work, "all-to-all.csv")
    flows_file(options.parasim, dragonfly, ["permutation", "--seed", "1"], "1M", perm)
    flows_file(options.parasim, fat_tree, ["all-to-all"], "1M", a2a)
    ring_cluster = os.path.join(ROOT, "scenarios", "fat-tree-k16.toml")
    cases = [
        ("dragonfly-permutation", "1024-host dragonfly (df 8,1;4,1;8,1;4), random permutation (seed 1), 1 MiB",
         lambda: run_parasim_traffic(options.parasim, dragonfly, perm),
         lambda: run_simgrid(flowsim, "df:8,1;4,1;8,1;4", [perm])),
        ("all-to-all-256", "256 hosts of a k=16 fat-tree, all-to-all, 1 MiB (65,280 flows)",
         lambda: run_parasim_traffic(options.parasim, fat_tree, a2a),
         lambda: run_simgrid(flowsim, "ft:3;8,8,16;1,8,8;1,1,1", [a2a])),
        ("ring-1024", "1024-host k=16 fat-tree, ring all-reduce of 1 GiB, per-host steps (2,095,104 flows)",
         lambda: run_parasim_ring(options.parasim, ring_cluster),
         lambda: run_simgrid(flowsim, "ft:3;8,8,16;1,8,8;1,1,1", ["ring", "1024", str(1 << 30)])),
    ]
    print(f"# SimGrid {version} (CM02, no cross-traffic, --pure) against {options.parasim}; "
          f"{options.runs} alternating runs each; {os.cpu_count()} cores")
    print("| case | parasim sim s (min/median/max) | SimGrid sim s (min/median/max) | sim ratio (medians) "
          "| parasim process s (median) | SimGrid process s (median) | process ratio | simulated time |")
    print("|---|---|---|---|---|---|---|---|")
    for name, label, ours, theirs in cases:
        if options.case and name not in options.case:
            continue
        p_sim, p_wall, s_sim, s_wall = [], [], [], []
        simulated = None
        for _ in range(options.runs):
            a, b, p_time = ours()
            c, d, s_time = theirs()
            p_sim.append(a), p_wall.append(b), s_sim.append(c), s_wall.append(d)
            if abs(p_time - s_time) > 1e-9 + 1e-6 * s_time:
                sys.exit(f"{name}: simulated times differ: parasim {p_time} s, SimGrid {s_time} s")
            simulated = s_time
        ps, ss = summary(p_sim), summary(s_sim)
        fmt = lambda t: "/".join(f"{x:.4f}" for x in t)
        print(f"| {label} | {fmt(ps)} | {fmt(ss)} | {ss[1] / ps[1]:.0f}x | {statistics.median(p_wall):.3f} "
              f"| {statistics.median(s_wall):.3f} | {statistics.median(s_wall) / statistics.median(p_wall):.0f}x "
              f"| {simulated:.9f} s both |", flush=True)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
