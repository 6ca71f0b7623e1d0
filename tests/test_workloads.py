"""Named workloads and the sampled length sources: files, determinism, Poisson gaps, means."""

from __future__ import annotations

import tomllib

import numpy as np
import pytest
from scipy import stats

from sim.core.errors import ConfigError
from sim.workloads import WORKLOADS_DIR, available_workloads, build_workload, workload_kinds

NAMED = [
    "azure-conv", "azure-code", "azure-conv-synth", "azure-conv-replay", "sharegpt", "cnn",
    "cnn-reversed", "prefill-heavy", "decode-heavy",
]
SAMPLED = ["azure-conv-synth", "sharegpt", "cnn", "cnn-reversed", "prefill-heavy", "decode-heavy"]


@pytest.fixture(autouse=True)
def no_trace_cache(tmp_path, monkeypatch):
    # Sampled workloads must work on a fresh machine: no trace reachable here.
    monkeypatch.setenv("PIPESIM_CACHE", str(tmp_path / "empty-cache"))


def build(name: str, seed: int = 1, **over):
    return build_workload({"name": name, **over}, seed=seed)


def arrays(reqs):
    return (
        np.array([r.arrival_s for r in reqs]),
        np.array([r.prompt_tokens for r in reqs]),
        np.array([r.output_tokens for r in reqs]),
    )


def test_named_files_exist_with_kind_and_description():
    assert set(NAMED) <= set(available_workloads())
    for name in available_workloads():
        with (WORKLOADS_DIR / f"{name}.toml").open("rb") as fh:
            table = tomllib.load(fh)
        assert table["kind"] in KINDS, name
        assert table.get("description", "").strip(), f"{name} has no description"
    assert set(workload_kinds.names()) == set(KINDS)


KINDS = ("trace", "poisson", "synthetic-uniform", "conversation", "shared-prefix", "bench")


@pytest.mark.parametrize("name", SAMPLED)
def test_sampled_workloads_build_without_trace(name):
    reqs = build(name)
    t, p, o = arrays(reqs)
    assert [r.req_id for r in reqs] == list(range(len(reqs)))
    assert t[0] == 0.0 and np.all(np.diff(t) >= 0)
    assert p.min() >= 1 and o.min() >= 1
    assert p.dtype.kind == "i" and o.dtype.kind == "i"


@pytest.mark.parametrize("name", SAMPLED)
def test_same_seed_same_workload_different_seed_different(name):
    assert build(name, seed=7) == build(name, seed=7)
    a, b = arrays(build(name, seed=7)), arrays(build(name, seed=8))
    assert not np.array_equal(a[0], b[0])
    assert not np.array_equal(a[1], b[1])


def test_lengths_do_not_depend_on_rate():
    # The artifact samples the dataset once and reuses it for every rate of a sweep.
    _, p1, o1 = arrays(build("sharegpt", rate_rps=1.0))
    _, p2, o2 = arrays(build("sharegpt", rate_rps=9.0))
    assert np.array_equal(p1, p2) and np.array_equal(o1, o2)


def test_poisson_gaps_are_exponential():
    rate = 4.0
    t, _, _ = arrays(build("azure-conv-synth", num_requests=5000, rate_rps=rate))
    gaps = np.diff(t)
    res = stats.kstest(gaps, "expon", args=(0, 1 / rate))
    assert res.pvalue > 0.01, res
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.05)


@pytest.mark.parametrize(
    "name, prompt_mean, output_mean, rel",
    [
        ("azure-conv-synth", 1154.7, 211.1, 0.03),  # full conv trace
        ("sharegpt", 219.6, 202.9, 0.03),  # shared-data ShareGPT lengths
        ("cnn", 883, 65, 0.03),  # paper means
        ("cnn-reversed", 65, 883, 0.03),
    ],
)
def test_sampled_means_match_targets(name, prompt_mean, output_mean, rel):
    _, p, o = arrays(build(name, num_requests=20000))
    assert p.mean() == pytest.approx(prompt_mean, rel=rel)
    assert o.mean() == pytest.approx(output_mean, rel=rel)


def test_sharegpt_filter_and_correlation():
    _, p, o = arrays(build("sharegpt", num_requests=20000))
    assert p.min() >= 4 and p.max() <= 1024 and o.min() >= 4 and (p + o).max() <= 2048
    # The joint model keeps ShareGPT's negative rank correlation (-0.41 in the data) ...
    assert stats.spearmanr(p, o)[0] == pytest.approx(-0.41, abs=0.05)
    # ... which independent sampling loses.
    _, p, o = arrays(build("sharegpt", num_requests=20000, lengths={"source": "sharegpt", "joint": False}))
    assert abs(stats.spearmanr(p, o)[0]) < 0.05


def test_cnn_clip_ranges_and_swap():
    _, p, o = arrays(build("cnn", num_requests=5000))
    assert p.min() >= 150 and p.max() <= 3000 and o.min() >= 15 and o.max() <= 200
    _, pr, orev = arrays(build("cnn-reversed", num_requests=5000))
    assert np.array_equal(pr, o) and np.array_equal(orev, p)


def test_synthetic_uniform_ranges():
    _, p, o = arrays(build("prefill-heavy"))
    assert 512 <= p.min() and p.max() <= 1024 and 32 <= o.min() and o.max() <= 64
    _, p, o = arrays(build("decode-heavy"))
    assert 32 <= p.min() and p.max() <= 64 and 512 <= o.min() and o.max() <= 1024
    t, _, _ = arrays(build("decode-heavy"))
    assert len(t) / t[-1] == pytest.approx(14, rel=0.1)


def test_pairs_source_keeps_its_behaviour():
    table = {"kind": "poisson", "rate_rps": 2.0, "lengths": {"prompt_tokens": [5, 6], "output_tokens": [7, 8]}}
    reqs = build_workload(table, seed=0)
    assert [(r.prompt_tokens, r.output_tokens) for r in reqs] == [(5, 7), (6, 8)]
    reqs = build_workload({**table, "num_requests": 5}, seed=0)
    assert [r.prompt_tokens for r in reqs] == [5, 6, 5, 6, 5]


@pytest.mark.parametrize(
    "lengths, needle",
    [
        ({"source": "nope"}, "must be one of: pairs, quantile-table, sharegpt, lognormal"),
        ({"source": "quantile-table", "table": "nope"}, "must be one of: azure-conv, sharegpt"),
        ({"source": "quantile-table", "table": "azure-conv", "joint": "yes"}, "'joint'"),
        ({"source": "sharegpt", "tabel": "x"}, "unknown field 'tabel'"),
        ({"source": "lognormal", "prompt": {"mean": 10, "cv": 0}, "output": {"mean": 5, "cv": 1}}, "'cv'"),
        ({"source": "lognormal", "prompt": {"mean": 10, "cv": 1, "clip": [5, 1]}, "output": {"mean": 5, "cv": 1}},
         "'clip'"),
        ({"source": "lognormal", "prompt": 3, "output": {"mean": 5, "cv": 1}}, "field 'prompt'"),
        ({"source": "sharegpt", "swap": 1}, "'swap'"),
    ],
)
def test_bad_length_sources_give_one_line_errors(lengths, needle):
    table = {"kind": "poisson", "rate_rps": 1.0, "num_requests": 10, "lengths": lengths}
    with pytest.raises(ConfigError) as exc:
        build_workload(table, seed=0)
    msg = str(exc.value)
    assert "\n" not in msg and needle in msg and "config [workload]" in msg


def test_sampled_source_needs_num_requests():
    with pytest.raises(ConfigError, match="num_requests"):
        build_workload({"kind": "poisson", "rate_rps": 1.0, "lengths": {"source": "sharegpt"}}, seed=0)
