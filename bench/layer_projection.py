import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench.gpu_bench import GLM47_CONFIG

FITTED = ("step_ms", "relaunched_ms", "floor_ms")


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="bench/layer_projection.py",
        description="The cost of one MoE layer and the rest of a decode step, fitted by least squares over "
                    "gpu_bench.py --json results taken with different --moe-layers, and the step projected to the "
                    "full model's layers (tokens/s a GPU's worth of work).")
    parser.add_argument("results", nargs="+", help="gpu_bench.py --json files, at least two MoE layer counts")
    parser.add_argument("--moe-layers", type=int, default=None,
                        help="MoE layers to project to; the GLM-4.7-FP8 config's (num_hidden_layers minus "
                             "first_k_dense_replace) when left out")
    parser.add_argument("--json", help="write the fit and the projection to this file")
    return parser.parse_args(argv)


def full_model_moe_layers():
    config = json.loads(GLM47_CONFIG.read_text())
    return config["num_hidden_layers"] - config["first_k_dense_replace"]


def line_fit(points):
    if len({x for x, _ in points}) < 2:
        raise ValueError("the results need at least two different MoE layer counts")
    slope, intercept = np.polyfit([x for x, _ in points], [y for _, y in points], 1)
    return float(intercept), float(slope)


def decode_rows_by_batch(results):
    by_batch = {}
    for result in results:
        layers = result["moe_layers"]
        for row in result["glmrt"]["decode"]:
            by_batch.setdefault(row["batch"], []).append((layers, row))
    return by_batch


def project(results, moe_layers):
    devices = {result["glmrt"]["info"]["num_devices"] for result in results}
    if len(devices) != 1:
        raise ValueError(f"the results were taken over different GPU counts: {sorted(devices)}")
    projections = []
    for batch, measured in sorted(decode_rows_by_batch(results).items()):
        if len({layers for layers, _ in measured}) < 2:
            continue
        fits = {}
        for key in FITTED:
            rest, per_layer = line_fit([(layers, row[key]) for layers, row in measured])
            fits[key] = dict(rest_ms=rest, per_moe_layer_ms=per_layer, projected_ms=rest + per_layer * moe_layers)
        step = fits["step_ms"]["projected_ms"]
        relaunched = fits["relaunched_ms"]["projected_ms"]
        floor = fits["floor_ms"]["projected_ms"]
        projections.append(dict(batch=batch, fits=fits, step_ms=step, tokens_per_s=1e3 * batch / step,
                                roofline_fraction=floor / step, relaunched_ms=relaunched,
                                relaunched_tokens_per_s=1e3 * batch / relaunched,
                                relaunched_roofline_fraction=floor / relaunched))
    if not projections:
        raise ValueError("no batch was measured at two different MoE layer counts")
    return dict(moe_layers=moe_layers, num_devices=devices.pop(),
                measured_moe_layers=sorted({result["moe_layers"] for result in results}), batches=projections)


def print_projection(projection):
    layers = projection["moe_layers"]
    print(f"fitted over MoE layer counts {projection['measured_moe_layers']} on {projection['num_devices']} GPU(s), "
          f"projected to {layers} MoE layers")
    print("| batch | one MoE layer ms | rest of the step ms | projected step ms | tokens/s | roofline | "
          "relaunched: one MoE layer ms | rest ms | projected ms | tokens/s | roofline |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for row in projection["batches"]:
        step = row["fits"]["step_ms"]
        relaunched = row["fits"]["relaunched_ms"]
        print(f"| {row['batch']} | {step['per_moe_layer_ms']:.3f} | {step['rest_ms']:.2f} | {row['step_ms']:.1f} | "
              f"{row['tokens_per_s']:.0f} | {100 * row['roofline_fraction']:.1f}% | "
              f"{relaunched['per_moe_layer_ms']:.3f} | {relaunched['rest_ms']:.2f} | {row['relaunched_ms']:.1f} | "
              f"{row['relaunched_tokens_per_s']:.0f} | {100 * row['relaunched_roofline_fraction']:.1f}% |")


def main(argv):
    args = parse_args(argv)
    moe_layers = args.moe_layers if args.moe_layers is not None else full_model_moe_layers()
    if moe_layers < 0:
        print(f"layer_projection: {moe_layers} MoE layers cannot be projected to", file=sys.stderr)
        return 2
    try:
        results = [json.loads(Path(path).read_text()) for path in args.results]
        projection = project(results, moe_layers)
    except (OSError, ValueError) as failure:
        print(f"layer_projection: {failure}", file=sys.stderr)
        return 1
    except KeyError as missing:
        print(f"layer_projection: a result lacks the field {missing}; pass files gpu_bench.py --json wrote",
              file=sys.stderr)
        return 1
    print_projection(projection)
    if args.json:
        Path(args.json).write_text(json.dumps(projection, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
