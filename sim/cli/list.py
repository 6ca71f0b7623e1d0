"""`ppsim list`: the shipped profiles, workloads, trace formats, policies, schemes and experiments."""

from __future__ import annotations

import argparse


def cmd_list(args) -> int:
    from sim.core.config import REPO_ROOT
    from sim.policies import chunk_policies, rebalancers
    from sim.workloads import available_workloads

    profiles = sorted(str(p.parent.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "profiles").glob("*/*/tp*/meta.toml"))
    print("profiles:\n  " + "\n  ".join(profiles or ["(none)"]))
    from sim.profiling.library import built_profile_lines

    print("built profiles (ppsim profile build --all; any other model/GPU/TP is built on demand):\n  "
          + "\n  ".join(built_profile_lines() or ["(none)"]))
    print("workloads:\n  " + "\n  ".join(available_workloads() or ["(none)"]))
    from sim.workloads.trace import trace_formats

    print("trace file formats (ppsim run --trace FILE, ppsim workload stats FILE):\n  "
          + ", ".join(n for n in trace_formats.names() if n != "auto") + " (detected: format = auto)")
    width = max(len(n) for n in chunk_policies.names() + rebalancers.names())
    for title, reg in (("chunk policies", chunk_policies), ("rebalancers", rebalancers)):
        print(f"{title}:\n  " + "\n  ".join(f"{n:<{width}}  ({reg.origin(n)})" for n in reg.names()))
    from experiments import EXPERIMENT_IDS
    from sim.core.schemes import SCHEMES

    print("schemes:\n  " + "\n  ".join(SCHEMES))
    print("experiments (ppsim reproduce ID):\n  " + "\n  ".join(EXPERIMENT_IDS))
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("list", help="show shipped profiles, workloads, policies, schemes and experiments",
                       epilog="examples:\n  ppsim list\n  ppsim list | grep qwen2.5-14b\n",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(func=cmd_list)
