import argparse
import csv
import gzip
import sys
from collections import defaultdict
from pathlib import Path

STEP_MARKER = "glmrt_embed_kernel"


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description="Where a step's time goes on each GPU, from the kernel timeline step_profile.py --trace writes: "
                    "each kernel is charged the time it moves its GPU's frontier (its end past the latest end so far), "
                    "which stays true when dependent launches overlap a kernel with the one before.")
    parser.add_argument("timeline", help="the kernel CSV (plain or .gz) from step_profile.py --trace")
    parser.add_argument("--top", type=int, default=20, help="kernels listed per GPU")
    parser.add_argument("--devices", default="", help="comma-separated GPU indices; every GPU when empty")
    return parser.parse_args(argv)


def read_kernels(path):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", newline="") as source:
        kernels = []
        for row in csv.DictReader(source):
            start = float(row["start_us"])
            length = float(row["us"])
            kernels.append(dict(device=int(row["device"]), start=start, end=start + length, name=row["kernel"]))
    return kernels


def last_step(kernels):
    markers = sorted(kernel["start"] for kernel in kernels if kernel["name"] == STEP_MARKER)
    begin = markers[-1] if markers else min(kernel["start"] for kernel in kernels)
    return begin, sorted((kernel for kernel in kernels if kernel["start"] >= begin), key=lambda kernel: kernel["start"])


def frontier_shares(step_kernels, begin):
    frontier = begin
    charged = defaultdict(float)
    launches = defaultdict(int)
    idle = 0.0
    for kernel in step_kernels:
        idle += max(0.0, kernel["start"] - frontier)
        charged[kernel["name"]] += max(0.0, kernel["end"] - max(frontier, kernel["start"]))
        launches[kernel["name"]] += 1
        frontier = max(frontier, kernel["end"])
    return charged, launches, idle, frontier - begin


def device_report(kernels, device, top):
    begin, step_kernels = last_step(kernels)
    charged, launches, idle, wall = frontier_shares(step_kernels, begin)
    print(f"\nGPU {device}: last step {wall:.0f} us from its first kernel, idle {idle:.0f} us")
    print("| kernel | us a step | launches | us a launch | share |")
    print("|---|---|---|---|---|")
    for name, us in sorted(charged.items(), key=lambda item: -item[1])[:top]:
        print(f"| {name} | {us:.0f} | {launches[name]} | {us / launches[name]:.1f} | {100 * us / wall:.1f}% |")
    return begin


def main(argv):
    args = parse_args(argv)
    kernels = read_kernels(Path(args.timeline))
    if not kernels:
        print(f"{args.timeline} holds no kernels", file=sys.stderr)
        return 1
    present = sorted({kernel["device"] for kernel in kernels})
    wanted = [int(d) for d in args.devices.split(",") if d] or present
    starts = {}
    for device in wanted:
        own = [kernel for kernel in kernels if kernel["device"] == device]
        if not own:
            print(f"GPU {device} has no kernels in {args.timeline}", file=sys.stderr)
            return 1
        starts[device] = device_report(own, device, args.top)
    first = min(starts.values())
    print("\nlast step's first kernel on each GPU, after the earliest: " +
          ", ".join(f"GPU {device} +{start - first:.0f} us" for device, start in sorted(starts.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
