"""The fuzz suite (issue 32): Hypothesis over configs and `--set` overrides, traces, bench logs,
profile values and run folders: NaN, inf, huge, negative, wrong types, non-UTF-8, compressed,
damaged, cut and foreign files. Each case must keep the contract of tests/fuzzing.py: exit 0 with a
valid result or one line naming the input (an error caused by a `--set` names it as `--set KEY`)
and exit 2; no hang, traceback, internal error, write outside `--out`, or change to a file that
existed before or to the project's files (`confined`).

`make test` runs a few hundred cases (FUZZ_EXAMPLES per test, PROFILE_SCALE times that for profile
values); `make test-all` (--runslow) runs at least 10^4 in all (FUZZ_EXAMPLES_SLOW per test).
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import hypothesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.core.limits import max_num_requests
from tests.fuzzing import check, confined, invoke, snapshot, toml_value, tree_state, tree_unchanged

REPO = Path(__file__).resolve().parents[1]
DEFAULT = str(REPO / "experiments" / "configs" / "default.toml")
FUZZ_EXAMPLES = 60
FUZZ_EXAMPLES_SLOW = 2600  # x 6 tests: > 10^4
# the profile-values test's fast tier runs this many times FUZZ_EXAMPLES: a random key of a profile is
# seldom one the simulator reads, and its cases are cheap (a tiny profile, 20 requests)
PROFILE_SCALE = 4


def examples(request, scale: int = 1):
    """The settings decorator of a fuzz test: FUZZ_EXAMPLES (x `scale`) cases, FUZZ_EXAMPLES_SLOW with
    --runslow, PIPESIM_FUZZ_EXAMPLES by hand; the same cases every run unless PIPESIM_FUZZ_SEED."""
    slow = request.config.getoption("--runslow")
    n = FUZZ_EXAMPLES_SLOW if slow else FUZZ_EXAMPLES * scale
    n = int(os.environ.get("PIPESIM_FUZZ_EXAMPLES", n))  # (to hunt with more cases by hand)
    seed = os.environ.get("PIPESIM_FUZZ_SEED")  # unset: the same cases every run (derandomized)
    chosen = settings(max_examples=n, deadline=None, derandomize=seed is None, database=None,
                      suppress_health_check=list(HealthCheck))
    if seed is None:
        return chosen
    return lambda test: hypothesis.seed(int(seed))(chosen(test))  # (a failure found so is found again)


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
    "scheduler.max_prefill_tokens", "scheduler.ignore_eos", "server.host_time",
]
ENGINE_VALUES = st.sampled_from(["fastpp", "sglang", "vllm-v1", "vllm-v0"])
# Every case runs few requests, so that a legal value finishes quickly and a hang stands out.
SMALL = ["--set", "workload.num_requests=6", "--no-iterations"]


@pytest.fixture
def fuzz_settings(request):
    return examples(request)


def _run_case(tmp: Path, argv: list[str], names: tuple[str, ...], sets: tuple[str, ...] = (),
              tree: Path | None = REPO) -> str:
    out = tmp / "out"
    shutil.rmtree(out, ignore_errors=True)
    before = snapshot(tmp, skip=out)
    with confined(tmp, label=f"ppsim {' '.join(argv)}", tree=tree):  # (writes only under tmp, the project unchanged)
        code, stdout, stderr = invoke([*argv, "--out", str(out)])
    verdict = check(argv, code, stdout, stderr, run_dir=out if code != 2 else None, names=names, sets=sets)
    assert snapshot(tmp, skip=out) == before, f"ppsim {' '.join(argv)}: wrote or changed files outside --out"
    return verdict


def test_fuzz_config_overrides(tmp_path, fuzz_settings):
    @fuzz_settings
    @given(st.lists(st.tuples(st.sampled_from(KEYS), VALUES), min_size=1, max_size=3), ENGINE_VALUES)
    def case(overrides, engine):
        # a valid request count in the tens of thousands or more is no hostile input, only a long run
        # (tens of CPU seconds per 10^5 requests): not drawn; past the memory limit it is refused at once
        hypothesis.assume(not any(k == "workload.num_requests" and type(v) is int and 20_000 < v <= max_num_requests()
                                  for k, v in overrides))
        argv = ["run", DEFAULT, *SMALL, "--set", f'scheduler.engine="{engine}"']
        for key, value in overrides:
            argv += ["--set", f"{key}={toml_value(value)}"]
        _run_case(tmp_path, argv, names=tuple(k for k, _ in overrides) + ("--set",),
                  sets=tuple(k for k, _ in overrides) + ("scheduler.engine",))

    case()


# ---------------------------------------------------------------- the surfaces of issue 40
# conversations, clusters, disaggregated pools and engine knobs: a base that is valid, then 1-3
# overrides of that surface's keys, hostile or plausible (plausible values reach the code past the
# range checks: pools of other shapes, networks, session counts)

DISAGG = str(REPO / "experiments" / "configs" / "disagg_70b.toml")
SURFACES = {
    "conversation": (["run", DEFAULT, "--set", 'workload={name="chat-sessions", num_sessions=4}'], [
        "workload.num_sessions", "workload.turns_mean", "workload.think_time_s", "workload.reply_time_s",
        "workload.max_context_tokens", "workload.rate_rps", "workload.lengths.source", "workload.chars_per_token",
        "workload.file", "workload.num_requests", "scheduler.prefix_cache", "scheduler.kv_tokens",
    ]),
    "cluster": (["run", DEFAULT, "--set", 'cluster={nodes = 2, gpus_per_node = 2, network = "ib-hdr"}'], [
        "cluster.nodes", "cluster.gpus_per_node", "cluster.nics_per_node", "cluster.network", "cluster.gpu",
        "cluster.interconnect", "cluster.bogus", "parallel.pp", "parallel.tp", "parallel.replicas",
    ]),
    "disaggregation": ([ "run", DISAGG], [
        "disaggregation.kv_transfer", "disaggregation.first_token", "disaggregation.decode_reserve_tokens",
        "disaggregation.prefill.tp", "disaggregation.prefill.pp", "disaggregation.prefill.instances",
        "disaggregation.prefill.chunk_size_tokens", "disaggregation.prefill.kv_tokens",
        "disaggregation.decode.tp", "disaggregation.decode.instances", "disaggregation.decode.profile",
        "disaggregation.decode.max_running_requests", "disaggregation.bogus", "cluster.nodes", "cluster.nics_per_node",
    ]),
    "engine": (["run", DEFAULT, "--set", "parallel.pp=1"], [
        "scheduler.engine", "scheduler.overlap", "scheduler.schedule_policy", "scheduler.max_prefill_tokens",
        "scheduler.ignore_eos", "scheduler.long_prefill_token_threshold", "scheduler.block_size_tokens",
        "scheduler.cuda_graphs", "scheduler.prefix_cache", "scheduler.kv_tokens", "scheduler.mem_fraction",
    ]),
}
PLAUSIBLE = st.one_of(st.integers(0, 16), st.sampled_from([
    "ib-ndr", "efa-p5", "roce-100g", "nvswitch", "pcie", "h100-sxm-80gb", "a100-sxm-80gb", "layerwise", "prefill",
    "after_prefill", "decode", "fcfs", "lpm", "sglang", "vllm-v1", "vllm-v0", "fastpp", "sharegpt", 1.5, 0.25,
    "profiles/built/h100-sxm-80gb/qwen2.5-72b/tp4", "profiles/built/a100-sxm-80gb/llama-3.1-70b/tp4",
    "profiles/built/h100-sxm-80gb/llama-3.1-70b/tp2", True, False, 4096, 10**6, 1000,
]))


def test_fuzz_new_surfaces(tmp_path, request):
    @examples(request)
    @given(st.sampled_from(sorted(SURFACES)), st.data())
    def case(surface, data):
        base, keys = SURFACES[surface]
        overrides = data.draw(st.lists(st.tuples(st.sampled_from(keys), st.one_of(PLAUSIBLE, VALUES)),
                                       min_size=1, max_size=3))
        hypothesis.assume(not any(k in ("workload.num_sessions", "workload.num_requests") and type(v) is int
                                  and v > 200 for k, v in overrides))  # (valid and only long: not hostile)
        argv = [*base, *SMALL]
        for key, value in overrides:
            argv += ["--set", f"{key}={toml_value(value)}"]
        base_sets = tuple(a.split("=", 1)[0] for a in base[3:] if "=" in a)
        _run_case(tmp_path, argv, names=tuple(k for k, _ in overrides) + ("--set",),
                  sets=tuple(k for k, _ in overrides) + base_sets)

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


DAMAGE = st.sampled_from(["none", "cut", "gzip", "gzip-damaged", "gzip-cut", "latin1", "garbage", "empty", "bom",
                          "nul"])


def _damage(data: bytes, how: str, cut_at: int) -> bytes:
    if how == "cut":
        return data[: max(1, cut_at % max(1, len(data)))]
    if how == "gzip":
        return gzip.compress(data)
    if how in ("gzip-damaged", "gzip-cut"):  # a compressed file with a byte of its stream changed, or cut
        z = bytearray(gzip.compress(data))
        at = 10 + cut_at % max(1, len(z) - 18)
        if how == "gzip-cut":
            return bytes(z[:at])
        z[at] ^= 0x5A
        return bytes(z)
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
        with confined(tmp_path, label=f"ppsim {' '.join(argv)}"):
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
        with confined(tmp_path, label=f"ppsim {' '.join(argv)}"):  # (report writes report.md into the folder)
            code, out, err = invoke(argv)
        check(argv, code, out, err, names=(str(folder),))
        after = snapshot(folder)
        assert {k: v for k, v in after.items() if k in existing} == existing, "a file that existed was changed"

    case()


# ---------------------------------------------------------------- profile values

PROFILES = {"tiny": REPO / "tests" / "data" / "tiny-profile",
            "built": REPO / "profiles" / "built" / "a100-pcie-40gb" / "llama-3.1-8b" / "tp1"}
PROFILE_FILES = ["meta.toml", "layer_nonattn.csv", "attention.csv"]
# what a number in a profile's text may be replaced by: TOML's and CSV's hostile spellings, wrong
# types, and (in meta.toml) text that is not TOML at all
PROFILE_TOKENS = st.sampled_from([
    "nan", "inf", "-inf", "+inf", "-1", "0", "-0.0", "1e308", "1e400", "1e-320", "1e300", "4e9", "2147483648",
    "9223372036854775808", "18446744073709551616", "99999999999999999999999", "0.5", "3", "1_000", "0x10",
    '"x"', '""', "x", "", "true", "[]", "[1, 2]", "{}", "{a = 1}", "1,2", '"', "NULL", "1e", "--1",
])
NUMBER = re.compile(r"(?<![\w.\"-])-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w.\"])")


def _replace_number(text: str, which: int, token: str) -> str:
    """`text` with its `which`-th number (mod their count) replaced by `token`."""
    spots = list(NUMBER.finditer(text))
    if not spots:
        return text
    m = spots[which % len(spots)]
    return text[: m.start()] + token + text[m.end():]


# (the sharpest first: a random key of a built profile's meta.toml is seldom one the simulator reads)
META_VALUES = st.one_of(st.sampled_from([math.nan, math.inf, -math.inf, 1e300, -1, 0, "x", [], {}]), HOSTILE, NUMBERS,
                        st.just("ms"))


def _set_meta_value(folder: Path, which: int, value) -> None:
    """meta.toml with one of its values or sections (`which` >= 0: any; < 0: one the simulator reads)
    set to `value` (any type) or removed (value None), written back as TOML."""
    import tomllib

    import tomli_w

    path = folder / "meta.toml"
    meta = tomllib.loads(path.read_text())
    leaves = []

    def walk(node, trail):
        for k, v in (node.items() if isinstance(node, dict) else enumerate(node)):
            if isinstance(v, (dict, list)) and v and not (isinstance(v, list) and isinstance(v[0], dict)):
                walk(v, trail + [k])
            elif not isinstance(v, str):
                leaves.append(trail + [k])
    walk(meta, [])
    keys = leaves + [[sec] for sec in meta]  # also whole sections: removed or replaced
    if which < 0:  # the numbers and tables the simulator reads (most of a built profile's are notes)
        from sim.latency.profiled import META_RANGES

        keys = [[sec, key] for sec, table in META_RANGES.items() if isinstance(meta.get(sec), dict)
                for key in table if key in meta[sec]] + [[sec] for sec in meta]
        if isinstance(meta.get("profile"), dict):
            keys += [["profile", k] for k in ("units", "sources", "tp") if k in meta["profile"]]
    if not keys:
        return
    trail = keys[which % len(keys)]
    node = meta
    for k in trail[:-1]:
        node = node[k]
    if value is None:
        del node[trail[-1]]
    elif isinstance(node, list) and isinstance(value, (dict, list)):
        node[trail[-1]] = 1e300  # (a TOML array holds no tables beside numbers)
    else:
        node[trail[-1]] = value
    try:
        path.write_text(tomli_w.dumps(meta))
    except (TypeError, ValueError):  # not writable as TOML (e.g. a mixed array): the number instead
        path.write_text(_replace_number(path.read_text(), which, "1e300"))


PROFILE_DAMAGE = st.one_of(
    st.tuples(st.just("number"), st.sampled_from(PROFILE_FILES), st.integers(0, 10_000), PROFILE_TOKENS),
    st.tuples(st.just("meta-value"), st.just("meta.toml"), st.integers(-10_000, 10_000),
              st.one_of(META_VALUES, st.none())),
    st.tuples(st.just("file"), st.sampled_from(PROFILE_FILES), st.integers(0, 10_000),
              st.sampled_from(["cut", "gzip", "latin1", "garbage", "empty", "bom", "nul", "delete", "foreign"])),
)


def _damage_profile(folder: Path, damages) -> None:
    for how, name, which, what in damages:
        f = folder / name
        if not f.exists():
            continue
        if how == "number":
            f.write_bytes(_replace_number(f.read_bytes().decode("utf-8", "surrogateescape"), which, what)
                          .encode("utf-8", "surrogateescape"))
        elif how == "meta-value":
            try:
                _set_meta_value(folder, which, what)
            except (ValueError, UnicodeDecodeError):  # an earlier damage made it unreadable: left so
                pass
        elif what == "delete":
            f.unlink()
        elif what == "foreign":
            f.write_text("a,b,c\n1,2,3\n")
        else:
            f.write_bytes(_damage(f.read_bytes(), what, which))


def test_fuzz_profile_values(tmp_path, request):
    @examples(request, scale=PROFILE_SCALE)
    @given(st.sampled_from(sorted(PROFILES)), st.lists(PROFILE_DAMAGE, min_size=1, max_size=3),
           st.sampled_from(["run", "check"]))
    def case(kind, damages, command):
        folder = tmp_path / "prof"
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(PROFILES[kind], folder)
        _damage_profile(folder, damages)
        existing = snapshot(folder)
        if command == "run":
            argv = ["run", DEFAULT, "--set", f'latency.profile="{folder}"', "--set", "parallel.pp=1",
                    "--set", "workload.num_requests=20", "--no-iterations"]
            # (a profile whose memory cannot hold the model is refused by the engine, naming the config's
            # mem_fraction and the deployment, not the profile: sim/engine/run.py)
            _run_case(tmp_path, argv, names=(str(folder), "the model does not fit in GPU memory"))
        else:
            argv = ["profile", "check", str(folder)]
            with confined(tmp_path, label=f"ppsim {' '.join(argv)}"):
                code, out, err = invoke(argv)
            check(argv, code, out, err, names=(str(folder),))
        assert snapshot(folder) == existing, "a file of the profile was changed"

    case()


SHARP = [math.nan, math.inf, -math.inf, 1e300, -1e300, 1e-300, -1, 0, 2**64, "x", [], {}, True]


def test_every_profile_number_the_simulator_reads_at_every_sharp_value(tmp_path):
    """Not at random: each key of META_RANGES (and each section) of the tiny profile set to each of
    SHARP (or removed), run with it: a random key of a profile is seldom one the simulator reads."""
    import tomllib

    import tomli_w

    from sim.latency.profiled import META_RANGES

    base = tomllib.loads((PROFILES["tiny"] / "meta.toml").read_text())
    spots = [(sec, key) for sec, keys in META_RANGES.items() for key in keys] + [(sec, None) for sec in base]
    folder, n = tmp_path / "prof", 0
    # the project's tree compared once around the ~800 cases, not around each (two walks of the tree
    # were half of each case's time); each case's own writes are still held to tmp_path (confined)
    tree = tree_state()
    for sec, key in spots:
        for value in [*SHARP, None]:
            meta = json.loads(json.dumps(base))  # (a deep copy)
            if key is None:
                if value is None:
                    del meta[sec]
                else:
                    meta[sec] = value
            else:
                table = meta.setdefault(sec, {})
                if value is None:
                    table.pop(key, None)
                else:
                    table[key] = value
            shutil.rmtree(folder, ignore_errors=True)
            shutil.copytree(PROFILES["tiny"], folder)
            (folder / "meta.toml").write_text(tomli_w.dumps(meta))
            argv = ["run", DEFAULT, "--set", f'latency.profile="{folder}"', "--set", "parallel.pp=1",
                    "--set", "workload.num_requests=20", "--no-iterations"]
            _run_case(tmp_path, argv, names=(str(folder), "the model does not fit in GPU memory"), tree=None)
            n += 1
    tree_unchanged(tree, f"{n} runs of the tiny profile at sharp values")
    assert n > 500

def test_the_harness_sees_a_write_outside_the_case_and_a_change_to_the_tree(tmp_path, monkeypatch):
    import tests.fuzzing

    monkeypatch.setattr(tests.fuzzing, "SHARED_TREE", False)
    case, elsewhere, tree = tmp_path / "case", tmp_path / "elsewhere", tmp_path / "tree"
    for d in (case, elsewhere, tree):
        d.mkdir()
    (tree / "kept.txt").write_text("x")
    with confined(case, tree=tree):
        (case / "out.txt").write_text("fine")
    with pytest.raises(AssertionError, match="wrote outside"):
        with confined(case, tree=tree):
            (elsewhere / "stray.txt").write_text("no")
    with pytest.raises(AssertionError, match="wrote outside"):
        with confined(case, tree=tree):
            os.replace(elsewhere / "stray.txt", elsewhere / "moved.txt")
    with pytest.raises(AssertionError, match="wrote outside"):
        with confined(case, tree=tree):
            os.utime(tree / "kept.txt", ns=(1, 1))
    with pytest.raises(AssertionError, match="changed the project's tree"):
        with confined(case, tree=tree):  # a change no Python call made (C code, a child process)
            subprocess.run(["touch", "-d", "2001-01-01", str(tree / "kept.txt")], check=True)
    # a batch of cases whose tree is compared once around them: caught there
    before = tree_state(tree)
    with confined(case, tree=None):
        subprocess.run(["touch", "-d", "2002-02-02", str(tree / "kept.txt")], check=True)
    with pytest.raises(AssertionError, match="changed the project's tree"):
        tree_unchanged(before, "a batch", tree)
    code, out, err = 2, "", "ppsim: error: --set parallel.pp=0: pp must be >= 1\n"
    check(["run"], code, out, err, sets=("parallel.pp",))
    with pytest.raises(AssertionError, match="blames no --set"):
        check(["run"], code, out, "ppsim: error: config [parallel]: pp must be >= 1\n", sets=("parallel.pp",))
