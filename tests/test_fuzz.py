"""The fuzz suite (issue 32): Hypothesis over configs and `--set` overrides, traces, bench logs
and run folders: NaN, inf, huge, negative, wrong types, non-UTF-8, compressed, cut and foreign
files. Each case must keep the contract of tests/fuzzing.py: exit 0 with a valid result or one
line naming the input and exit 2; no hang, traceback, internal error, write outside `--out`, or
change to a file that existed before.

`make test` runs a few hundred cases (FUZZ_EXAMPLES per test); `make test-all` (--runslow) runs
at least 10^4 in all (FUZZ_EXAMPLES_SLOW per test).
"""

from __future__ import annotations

import gzip
import json
import math
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzzing import check, invoke, snapshot, toml_value

REPO = Path(__file__).resolve().parents[1]
DEFAULT = str(REPO / "experiments" / "configs" / "default.toml")
FUZZ_EXAMPLES = 60
FUZZ_EXAMPLES_SLOW = 2600  # x 4 tests: > 10^4


def examples(request) -> settings:
    n = FUZZ_EXAMPLES_SLOW if request.config.getoption("--runslow") else FUZZ_EXAMPLES
    n = int(os.environ.get("PIPESIM_FUZZ_EXAMPLES", n))  # (to hunt with more cases by hand)
    seed = os.environ.get("PIPESIM_FUZZ_SEED")  # unset: the same cases every run (derandomized)
    return settings(max_examples=n, deadline=None, derandomize=seed is None, database=None,
                    suppress_health_check=list(HealthCheck))


HOSTILE = st.sampled_from([
    math.nan, math.inf, -math.inf, 1e300, -1e300, 1e-300, -1, 0, 1, 3, 0.5, -0.0, 2**63, 2**64, -2**63, 10**8,
    "x", "", "nan", True, False, [], [1, "a"], [0, 0], {}, {"a": 1}, 10**4, 1e6,
])
NUMBERS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-2**70, 2**70))
VALUES = st.one_of(HOSTILE, NUMBERS, st.text(max_size=8))

KEYS = [
    "seed", "horizon_s", "parallel.pp", "parallel.tp", "parallel.replicas", "parallel.router",
    "scheduler.chunk_size_tokens", "scheduler.context_length_tokens", "scheduler.mem_fraction",
    "scheduler.kv_tokens", "scheduler.max_running_requests", "scheduler.chunk_policy.name",
    "scheduler.chunk_policy.params.tpot_coef", "latency.noise_cv", "latency.variance", "latency.kind",
    "latency.stage_ms", "latency.overhead_ms", "latency.overrides.s_mem", "latency.overrides.s_comp",
    "latency.overrides.c_cpu", "latency.overrides.allreduce_busbw_gbps", "latency.profile",
    "slo.ttft_ms", "slo.tpot_ms", "slo.e2e_ms", "slo.ttft_percentile", "slo.stop_factor",
    "slo.stop_when_violated", "server.on_kv_exhausted", "workload.rate_rps", "workload.num_requests",
    "workload.rate", "workload.lengths.source", "workload.name", "bogus", "parallel.bogus",
    "scheduler.engine", "scheduler.prefix_cache", "scheduler.block_size_tokens", "scheduler.cuda_graphs",
    "scheduler.long_prefill_token_threshold", "scheduler.schedule_policy", "scheduler.overlap",
]
ENGINE_VALUES = st.sampled_from(["fastpp", "sglang", "vllm-v1", "vllm-v0"])
# Every case runs few requests, so that a legal value finishes quickly and a hang stands out.
SMALL = ["--set", "workload.num_requests=6", "--no-iterations"]


@pytest.fixture
def fuzz_settings(request):
    return examples(request)


def _run_case(tmp: Path, argv: list[str], names: tuple[str, ...]) -> str:
    out = tmp / "out"
    shutil.rmtree(out, ignore_errors=True)
    before = snapshot(tmp, skip=out)
    repo_before = snapshot(REPO / "experiments" / "configs")
    code, stdout, stderr = invoke([*argv, "--out", str(out)])
    verdict = check(argv, code, stdout, stderr, run_dir=out if code != 2 else None, names=names)
    assert snapshot(tmp, skip=out) == before, f"ppsim {' '.join(argv)}: wrote or changed files outside --out"
    assert snapshot(REPO / "experiments" / "configs") == repo_before
    return verdict


def test_fuzz_config_overrides(tmp_path, fuzz_settings):
    @fuzz_settings
    @given(st.lists(st.tuples(st.sampled_from(KEYS), VALUES), min_size=1, max_size=3), ENGINE_VALUES)
    def case(overrides, engine):
        argv = ["run", DEFAULT, *SMALL, "--set", f'scheduler.engine="{engine}"']
        for key, value in overrides:
            argv += ["--set", f"{key}={toml_value(value)}"]
        _run_case(tmp_path, argv, names=tuple(k for k, _ in overrides) + ("--set",))

    case()


ROW = st.fixed_dictionaries({
    "t": st.one_of(st.floats(-1e3, 1e6), HOSTILE), "p": st.one_of(st.integers(-5, 50_000), HOSTILE),
    "o": st.one_of(st.integers(-5, 3_000), HOSTILE),
})


def _trace_bytes(fmt: str, rows: list[dict]) -> bytes:
    if fmt == "csv":
        lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"] + [f"{r['t']},{r['p']},{r['o']}" for r in rows]
        return ("\n".join(lines) + "\n").encode()
    if fmt == "jsonl":
        return "".join(json.dumps({"timestamp": r["t"], "input_length": r["p"], "output_length": r["o"]},
                                  default=str) + "\n" for r in rows).encode()
    return json.dumps([{"input_tokens": r["p"], "output_tokens": r["o"]} for r in rows], default=str).encode()


DAMAGE = st.sampled_from(["none", "cut", "gzip", "latin1", "garbage", "empty", "bom", "nul"])


def _damage(data: bytes, how: str, cut_at: int) -> bytes:
    if how == "cut":
        return data[: max(1, cut_at % max(1, len(data)))]
    if how == "gzip":
        return gzip.compress(data)
    if how == "latin1":
        return data.replace(b"0", b"\xe9", 1)
    if how == "garbage":
        return bytes((b * 7 + cut_at) % 256 for b in data[:200])
    if how == "empty":
        return b""
    if how == "bom":
        return b"\xef\xbb\xbf" + data
    if how == "nul":
        return data[:10] + b"\x00" + data[10:]
    return data


def test_fuzz_traces(tmp_path, fuzz_settings):
    @fuzz_settings
    @given(st.sampled_from(["csv", "jsonl", "json"]), st.lists(ROW, min_size=0, max_size=6), DAMAGE,
           st.integers(0, 10_000), st.sampled_from(["trace.csv", "trace.jsonl", "trace.json", "trace.gz", "t"]))
    def case(fmt, rows, damage, cut_at, name):
        trace = tmp_path / name
        trace.write_bytes(_damage(_trace_bytes(fmt, rows), damage, cut_at))
        _run_case(tmp_path, ["run", DEFAULT, "--trace", str(trace), "--no-iterations"], names=(str(trace), "--trace"))

    case()


LIST = st.lists(st.one_of(st.floats(-1, 5), HOSTILE), min_size=0, max_size=4)


def test_fuzz_bench_logs(tmp_path, fuzz_settings):
    @fuzz_settings
    @given(st.fixed_dictionaries({
        "request_rate": st.one_of(st.floats(0, 50), HOSTILE, st.just("inf")),
        "ttfts": LIST, "input_lens": st.lists(st.one_of(st.integers(-2, 3000), HOSTILE), max_size=4),
        "output_lens": st.lists(st.one_of(st.integers(-2, 300), HOSTILE), max_size=4),
        "itls": st.lists(st.lists(st.one_of(st.floats(-1, 1), HOSTILE), max_size=4), max_size=4),
        "mean_ttft_ms": st.one_of(st.floats(), HOSTILE), "completed": st.one_of(st.integers(-1, 5), HOSTILE),
    }), DAMAGE, st.integers(0, 10_000))
    def case(record, damage, cut_at):
        log = tmp_path / "bench.jsonl"
        log.write_bytes(_damage((json.dumps(record, default=str) + "\n").encode(), damage, cut_at))
        before = snapshot(tmp_path)
        argv = ["validate", "--bench-log", str(log)]
        code, out, err = invoke(argv)
        check(argv, code, out, err, names=(str(log), "--bench-log"))
        assert snapshot(tmp_path) == before

    case()


@pytest.fixture(scope="module")
def real_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("run") / "r"
    code, _, err = invoke(["run", DEFAULT, "--set", "workload.num_requests=12", "--out", str(run)])
    assert code == 0, err
    return run


RUN_FILES = ["summary.json", "requests.csv", "iterations.csv", "config.toml", "decisions.csv"]


def test_fuzz_run_folders(tmp_path, real_run, fuzz_settings):
    @fuzz_settings
    @given(st.lists(st.tuples(st.sampled_from(RUN_FILES), st.sampled_from(
        ["cut", "garbage", "empty", "latin1", "delete", "foreign", "nul", "json-list"]), st.integers(0, 100_000)),
        min_size=1, max_size=3), st.sampled_from(["report", "compare"]))
    def case(damages, command):
        folder = tmp_path / "run"
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(real_run, folder)
        for name, how, cut_at in damages:
            f = folder / name
            if how == "delete":
                f.unlink(missing_ok=True)
            elif how == "foreign":
                f.write_text("a,b,c\n1,2,3\n")
            elif how == "json-list":
                f.write_text("[1, 2]\n")
            elif f.exists():
                f.write_bytes(_damage(f.read_bytes(), how, cut_at))
        existing = snapshot(folder)
        argv = ["report", str(folder)] if command == "report" else \
            ["compare", str(folder), str(real_run), "--out", str(tmp_path / "cmp")]
        shutil.rmtree(tmp_path / "cmp", ignore_errors=True)
        code, out, err = invoke(argv)
        check(argv, code, out, err, names=(str(folder),))
        after = snapshot(folder)
        assert {k: v for k, v in after.items() if k in existing} == existing, "a file that existed was changed"

    case()
