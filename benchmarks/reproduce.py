"""Times `ppsim reproduce all` at full size, experiment by experiment, from an empty cache: wall and CPU seconds.

Run: `PIPESIM_CACHE=... python benchmarks/reproduce.py --jobs 2 [--out DIR]` (default: a fresh
temporary folder). With `--out experiments/results --record`, it regenerates the committed results
and writes the timing table, the command and the commit into experiments/results/README.md.
"""

from __future__ import annotations

import argparse
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from experiments import EXPERIMENT_IDS  # noqa: E402
from sim.cli import main as ppsim  # noqa: E402


def cpu_s() -> float:
    """User + system seconds of this process and of its finished workers (each experiment's runner shuts its
    worker processes down when the experiment ends, so they are counted by then): the number that does not
    depend on how loaded a shared machine is; on 2 idle cores the wall time is about CPU / 2."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default=None)
    ap.add_argument("--record", action="store_true", help="write the timing into OUT/README.md")
    ap.add_argument("--keep-cache", action="store_true", help="reuse OUT/cache (default: start empty)")
    args = ap.parse_args()
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="pipesim-bench-"))
    if not args.keep_cache:
        shutil.rmtree(out / "cache", ignore_errors=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--", "sim", "experiments/*.py", "profiles"],
                                cwd=REPO, capture_output=True, text=True).stdout.strip())
    from sim import native

    # (`import sim` enabled the compiled modules if fresh and not PIPESIM_PURE; workers do the same)
    engine = "the compiled engine (sim/native.py)" if native.active() else "the engine's Python sources"
    rows = []
    t_all, cpu_all = time.perf_counter(), cpu_s()
    for exp in EXPERIMENT_IDS:
        t0, c0 = time.perf_counter(), cpu_s()
        code = ppsim(["reproduce", exp, "--jobs", str(args.jobs), "--out", str(out), "--no-progress"])
        rows.append((exp, time.perf_counter() - t0, code))
        print(f"{exp}: {rows[-1][1]:.1f} s wall, {cpu_s() - c0:.1f} CPU s (exit {code})", flush=True)
        if code:
            return code
    total = time.perf_counter() - t_all
    cpu = cpu_s() - cpu_all
    print(f"total: {total:.1f} s ({total / 60:.1f} min) wall, {cpu:.1f} CPU s (about {cpu / 2 / 60:.1f} min on 2 "
          f"idle cores) with --jobs {args.jobs}")
    if args.record:
        lines = ["| experiment | wall time (s) |", "|---|---|"] + [f"| {e} | {t:.1f} |" for e, t, _ in rows]
        lines.append(f"| **all** | **{total:.1f}** ({total / 60:.1f} min) |")
        readme = out / "README.md"
        text = readme.read_text() if readme.is_file() else ""
        marker = "<!-- timing -->"
        block = (f"{marker}\nProduced by `PIPESIM_CACHE=../shared/data/azure-llm-inference-2023 python "
                 f"benchmarks/reproduce.py --jobs {args.jobs} --out experiments/results --record` "
                 f"(equivalent to `ppsim reproduce all --jobs {args.jobs}` from an empty cache) at commit "
                 f"`{commit}`{' plus uncommitted changes' if dirty else ''}, on {platform.machine()} with "
                 f"{args.jobs} worker processes (a 2-core machine), running {engine}, {time.strftime('%Y-%m-%d')}.\n\n"
                 + "\n".join(lines) + f"\n{marker}")
        if marker in text:
            a, _, rest = text.partition(marker)
            _, _, b = rest.partition(marker)
            text = a + block + b
        else:
            text += "\n" + block + "\n"
        readme.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
