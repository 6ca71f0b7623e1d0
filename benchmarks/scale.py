"""Memory and time at scale: peak RSS and wall time of whole runs of 10^4 to 10^6 requests.

Each size runs in a fresh subprocess, as `ppsim run --no-iterations` would: generate the
`azure-conv-synth` workload, simulate PP=4 (Qwen2.5-32B, A100-40GB PCIe, static chunk 512) at
a sustainable 4 req/s, summarize, and write requests.csv and summary.json into a temporary
folder. The child reports its own peak resident set size (getrusage ru_maxrss), its wall time
and its CPU time (user + system: unlike the wall time, not inflated by a loaded machine). Run: `python benchmarks/scale.py [--sizes 100000 1000000] [--iterations]`
(`--iterations` also writes iterations.csv).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, resource, sys, tempfile, time
from pathlib import Path
t0 = time.perf_counter()
from sim.cli import main
num, iterations = int(sys.argv[1]), sys.argv[2] == "1"
out = Path(tempfile.mkdtemp(prefix="ppsim-scale-"))
argv = ["run", "experiments/configs/default.toml", "--set", f"workload.num_requests={num}",
        "--set", "workload.rate_rps=4.0", "--json", "--out", str(out)]
if not iterations:
    argv.append("--no-iterations")
import contextlib, io
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    code = main(argv)
summary = json.loads(buf.getvalue())
wall = time.perf_counter() - t0
usage = resource.getrusage(resource.RUSAGE_SELF)
size = sum(p.stat().st_size for p in out.iterdir())
import shutil
shutil.rmtree(out)
print(json.dumps({"requests": num, "exit": code, "status": summary["status"],
                  "num_finished": summary["num_finished"], "iterations": summary["num_iterations"],
                  "wall_s": round(wall, 1), "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
                  "peak_rss_mb": round(usage.ru_maxrss / 1024),
                  "output_mb": round(size / 2**20, 1)}))
"""


def measure(num: int, iterations: bool) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(num), "1" if iterations else "0"], cwd=ROOT,
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{num} requests failed:\n{out.stderr.strip()}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--iterations", action="store_true", help="also write iterations.csv")
    args = ap.parse_args()
    rows = []
    for num in args.sizes:
        rows.append(measure(num, args.iterations))
        print(rows[-1], flush=True)
    if len(rows) > 1:
        a, b = rows[0], rows[-1]
        print(f"peak RSS x{b['peak_rss_mb'] / a['peak_rss_mb']:.2f} for x{b['requests'] / a['requests']:.0f} requests")


if __name__ == "__main__":
    main()
