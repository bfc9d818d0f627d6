#!/usr/bin/env python3
"""ncu-step.py LOG STEPS — ncu's `--metrics gpu__time_duration.sum --csv` output of a run of
`kiln bench -p 0 -n N -r 1` -> per kernel name (template arguments dropped): launches and
microseconds in total and per decode step (total / STEPS; STEPS 0: the number of argmax
launches, one per greedy step: kiln bench runs a warm-up pass too), largest first, and the
sum. Load-time kernels are included in the totals."""
import csv
import sys


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: ncu-step.py NCU_CSV_LOG STEPS")
    steps = int(sys.argv[2])
    with open(sys.argv[1], errors="replace") as f:
        lines = [l for l in f if l.startswith('"')]
    agg = {}
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = r.get("Kernel Name", "?").split("<")[0].split("(")[0].strip()
        name = name[5:] if name.startswith("void ") else name
        try:
            v = float(r.get("Metric Value", "0").replace(",", ""))
        except ValueError:
            continue
        unit = r.get("Metric Unit", "")
        us = v / 1000.0 if unit in ("nsecond", "ns") else v * 1000.0 if unit in ("msecond", "ms") else v
        n, t = agg.get(name, (0, 0.0))
        agg[name] = (n + 1, t + us)
    if steps <= 0:
        steps = sum(n for name, (n, _) in agg.items() if name.startswith("argmax")) or 1
        print(f"steps: {steps} (argmax launches)")
    tot_n = sum(n for n, _ in agg.values())
    tot_t = sum(t for _, t in agg.values())
    print(f"{'kernel':40s} {'launches':>8s} {'per step':>8s} {'us total':>10s} {'us/step':>9s}")
    for name, (n, t) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        print(f"{name[:40]:40s} {n:8d} {n / steps:8.1f} {t:10.1f} {t / steps:9.1f}")
    print(f"{'total':40s} {tot_n:8d} {tot_n / steps:8.1f} {tot_t:10.1f} {tot_t / steps:9.1f}")


if __name__ == "__main__":
    main()
