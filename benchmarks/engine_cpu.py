"""CPU seconds of one engine run (`sim.engine.run.run`), workload generation excluded: a small
side-by-side probe for comparing two trees on a busy machine, each in its own process.

Run from each tree, alternating: `PYTHONPATH=TREE python benchmarks/engine_cpu.py N [CONFIG]`
(N requests at 4 req/s of CONFIG's workload; default experiments/configs/default.toml, PP=4).
Prints the CPU seconds of the run and how many compiled modules were loaded (sim/native.py).
"""

import sys
import time

from sim.core.config import config_from_table
from sim.core.errors import ConfigError
from sim.core.tomlio import read_toml
from sim.engine.requests import RequestArrays
from sim.engine.run import run
from sim.workloads import build_workload
import sim.native as native

table = read_toml(sys.argv[2] if len(sys.argv) > 2 else "experiments/configs/default.toml", ConfigError)
table["workload"]["num_requests"] = int(sys.argv[1])
table["workload"]["rate_rps"] = 4.0
cfg = config_from_table(table)
arrays = RequestArrays.of(build_workload(cfg.workload, seed=cfg.seed))
t0 = time.process_time()
run(cfg, arrays)
print(f"{time.process_time() - t0:.2f} CPU s, {len(native._active)} compiled modules")
