"""`ppsim validate`: the simulator against a real SGLang/vLLM benchmark result."""

from __future__ import annotations

import argparse


VALIDATE_EPILOG = """examples:
  ppsim validate --bench-log sglang_0101_1000_sharegpt.jsonl       # bench_serving --output-details
  ppsim validate --bench-log vllm-4.0qps-Qwen2.5-32B.json --config experiments/configs/tp4.toml
  ppsim validate --bench-log run.jsonl --workload sharegpt --set scheduler.chunk_size_tokens=512
Reads SGLang bench_serving JSONL (one result per line) and vLLM benchmark_serving / vllm bench serve
JSON: request_rate, the per-request lists input_lens, output_lens, ttfts, itls, errors (seconds),
and the aggregates (mean/median/p99_ttft_ms, ...). The log's own successful requests are replayed
at its rate on the --config deployment (default: experiments/configs/default.toml), whose header
is printed; mean/P50/P90/P99 of TTFT, TPOT, ITL and E2E and the throughputs are compared.
The FastPP fork's ttfts/tpots/e2es lists (--units ms for ms) need --workload. See sim/studies/validate.py.
"""



def add_commands(sub) -> None:
    p = sub.add_parser("validate", help="compare the simulator with a real SGLang/vLLM benchmark result",
                       epilog=VALIDATE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bench-log", required=True,
                   help="SGLang bench_serving JSONL or vLLM benchmark_serving / vllm bench serve JSON result")
    p.add_argument("--workload", default=None,
                   help="simulate this workload instead of the log's own requests (needed when the log has no "
                        "input_lens/output_lens)")
    p.add_argument("--config", default=None, help="run config of the deployment (default: the embedded default)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override; repeatable")
    p.add_argument("--units", default="s", help="units of the lists in the log: s (default) or ms")
    p.add_argument("--engine", default=None, metavar="ENGINE",
                   help="scheduler to simulate (default: the one the log's backend names, else the config's)")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON records")
    p.set_defaults(func=cmd_validate)


def cmd_validate(args) -> int:
    import json
    import sys

    from experiments.common import REPO
    from sim.studies.validate import validate

    config = args.config or str(REPO / "experiments" / "configs" / "default.toml")
    # The headers say what was simulated; with --json they go to stderr, stdout stays JSON.
    echo = (lambda text: print(text, file=sys.stderr)) if args.json else print
    df = validate(args.bench_log, args.workload, config, args.set, args.units, echo=echo, engine=args.engine)
    if args.json:
        records = df.astype(object).where(df.notna(), None).to_dict(orient="records")  # NaN -> null
        print(json.dumps(records, indent=1))
    else:
        print(df.to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    return 0
