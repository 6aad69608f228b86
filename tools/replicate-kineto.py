#!/usr/bin/env python3
"""Builds a large Kineto trace by replicating the events of a real one, for measuring how
`parasim calibrate` and `parasim replay` scale with trace size (docs/compute-model.md,
"Large traces").

    python3 tools/replicate-kineto.py SOURCE.json[.gz] OUT.json --size-mb 1024

Each copy of the source's `traceEvents` is shifted in time past the end of the previous one
(plus a 1 ms gap), so no two copies overlap; correlation ids, `External id`s and flow ids are
shifted too, so every kernel still pairs with its own launch call, and `ProfilerStep#N`
numbers continue. Metadata (`ph` "M"), instant and `Trace` events are written once. Copies
are written until the output reaches the requested size. The source's other top-level keys
(`deviceProperties`, `distributedInfo`, ...) are kept. Only the standard library is used.
"""

import argparse
import gzip
import json
import sys


def load(path):
    opener = gzip.open if open(path, "rb").read(2) == b"\x1f\x8b" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def once(event):
    """Events written only with the first copy: they label tracks or the whole profile."""
    return event.get("ph") in ("M", "i") or event.get("cat") == "Trace"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source")
    parser.add_argument("output")
    parser.add_argument("--size-mb", type=float, required=True, help="stop once the output has this many MiB")
    args = parser.parse_args()

    document = load(args.source)
    events = document["traceEvents"] if isinstance(document, dict) else document
    timed = [e for e in events if isinstance(e, dict) and isinstance(e.get("ts"), (int, float))]
    start = min(e["ts"] for e in timed)
    stop = max(e["ts"] + (e.get("dur") or 0) for e in timed if isinstance(e.get("dur") or 0, (int, float)))
    shift = int(stop - start) + 1000  # microseconds
    id_stride = 1
    steps = 0
    for e in events:
        a = e.get("args") if isinstance(e.get("args"), dict) else {}
        for value in (a.get("correlation"), a.get("External id"), e.get("id")):
            if isinstance(value, int):
                id_stride = max(id_stride, value + 1)
        name = e.get("name")
        if isinstance(name, str) and name.startswith("ProfilerStep#"):
            try:
                steps = max(steps, int(name[len("ProfilerStep#"):]) + 1)
            except ValueError:
                pass

    target = int(args.size_mb * (1 << 20))
    head = {k: v for k, v in document.items() if k != "traceEvents"} if isinstance(document, dict) else {}
    written = 0
    copies = 0
    with open(args.output, "w", encoding="utf-8") as out:

        def write(text):
            nonlocal written
            out.write(text)
            written += len(text.encode("utf-8"))

        write("{")
        for key, value in head.items():
            write(json.dumps(key) + ": " + json.dumps(value) + ",\n")
        write('"traceEvents": [\n')
        first = True
        while written < target:
            for e in events:
                if not isinstance(e, dict) or (copies > 0 and once(e)):
                    continue
                if copies > 0:
                    e = dict(e)
                    if isinstance(e.get("ts"), (int, float)):
                        e["ts"] = e["ts"] + copies * shift
                    if isinstance(e.get("id"), int):
                        e["id"] = e["id"] + copies * id_stride
                    if isinstance(e.get("args"), dict):
                        a = dict(e["args"])
                        for key in ("correlation", "External id"):
                            if isinstance(a.get(key), int):
                                a[key] = a[key] + copies * id_stride
                        e["args"] = a
                    name = e.get("name")
                    if steps and isinstance(name, str) and name.startswith("ProfilerStep#"):
                        number = name[len("ProfilerStep#"):]
                        if number.strip().isdigit():
                            e["name"] = "ProfilerStep#%d" % (int(number) + copies * steps)
                write(("" if first else ",\n") + json.dumps(e, separators=(",", ":")))
                first = False
            copies += 1
        write("\n]}\n")
    print(f"{args.output}: {copies} copies of {args.source}, {written / (1 << 20):.0f} MiB", file=sys.stderr)


if __name__ == "__main__":
    main()
