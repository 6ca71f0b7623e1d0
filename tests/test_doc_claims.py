"""What README.md and workloads/README.md say is modelled, checked against the code where a test can see it
(issue 39: workloads/README.md said Mooncake `hash_ids` are not modelled while the reader turned them into
prefix pieces; the README said disaggregated pools run FastPP's scheduler while they run every engine's but
vLLM V0's). Each test reads the claim from the doc's own text and the fact from the registry or code that
decides it, so a doc or a code change alone fails here."""

from __future__ import annotations

import json
import re
import tomllib

import pytest

from sim.core.config import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text()
WORKLOADS = (REPO_ROOT / "workloads" / "README.md").read_text()


def _section(text: str, heading: str) -> str:
    """The text under a markdown heading `## heading`, up to the next `## `."""
    start = text.index(f"## {heading}")
    end = text.find("\n## ", start + 3)
    return text[start:] if end < 0 else text[start:end]


def _bullet(text: str, lead: str) -> str:
    """A `- **lead**: ...` bullet of the README, up to the next bullet."""
    start = text.index(f"- **{lead}**")
    end = text.find("\n- **", start + 3)
    return text[start:] if end < 0 else text[start:end]


def test_the_engines_the_readme_lists_are_the_registered_schedulers():
    from sim.core.config import ENGINES
    from sim.engine.schedulers import schedulers

    text = _section(README, "Engines and prefix caching")
    # "`fastpp` (the default: ...), `sglang` (SGLang 0.5.23: ...), `vllm-v1` (...) or `vllm-v0` (...)"
    listed = set(re.findall(r"`([a-z0-9-]+)` \((?:the default|SGLang|vLLM)", text))
    assert listed == set(schedulers.names()) == set(ENGINES)
    assert "only the four schedulers above" in README and len(ENGINES) == 4


def test_the_engine_versions_the_readme_lists_are_the_releases_modelled():
    from sim.engine.schedulers import schedulers

    text = _section(README, "Engines and prefix caching")
    para = text[text.index("An engine is a name and a version"):]
    para = para[:para.index("each read from")]
    for name in ("vllm-v1", "sglang", "vllm-v0"):
        part = re.search(rf"`{name}`: ([^;`]+)", para).group(1)
        claimed = dict(re.findall(r'"([0-9.]+)"\s*=\s*([0-9][0-9.a-z]*[0-9])', part))
        versions = schedulers.get(name).versions
        assert set(claimed) == set(versions), name
        for key, release in claimed.items():
            assert release in versions[key], (name, key)   # "0.10" = 0.10.1.1 -> "vLLM 0.10.1.1 (V1)"


@pytest.mark.parametrize("engine", ["fastpp", "sglang", "vllm-v1", "vllm-v0"])
def test_the_engines_with_a_prefix_cache_are_those_the_docs_name(engine):
    """workloads/README.md: "Engines with a prefix cache (`[scheduler] engine = "sglang" | "vllm-v1"`) serve the
    cached part from KV"; README: "Prefix caching is on where the engine ships it on". A run of requests sharing
    a system prompt reports a prefix hit rate (and hits) exactly on those engines."""
    from conftest import make_config
    from sim.engine.run import run
    from sim.outputs.metrics import summarize

    claimed = set(re.findall(r'"([a-z0-9-]+)"', re.search(r"Engines with a prefix cache\s*\(([^)]*)\)",
                                                          WORKLOADS).group(1)))
    sched = {"engine": engine, "chunk_size_tokens": 0 if engine == "vllm-v0" else 2048, "kv_tokens": 100_000}
    cfg = make_config(parallel={"pp": 1, "tp": 1}, scheduler=sched, latency={"kind": "constant", "stage_ms": 1.0},
                      workload={"kind": "shared-prefix", "rate_rps": 0.01, "num_requests": 3, "prefix_tokens": 128,
                                "lengths": {"source": "pairs", "prompt_tokens": [40], "output_tokens": [4]}})
    s = summarize(run(cfg))
    assert (engine in claimed) == bool(s.get("prefix_hit_rate"))


def test_the_workload_kinds_and_named_workloads_are_those_the_docs_list():
    from sim.workloads import workload_kinds

    intro = WORKLOADS[:WORKLOADS.index("| name |")]
    kinds = set(re.findall(r"`([a-z-]+)`", intro[intro.index("a `kind`") + 8:intro.index("a `description`")]))
    assert kinds == set(workload_kinds.names())
    named = WORKLOADS[WORKLOADS.index("| name |"):WORKLOADS.index("## Kinds and parameters")]
    table = {name: kind for name, kind in re.findall(r"^\| `([a-z0-9-]+)` \| ([a-z-]+) \|", named, re.M)}
    files = {p.stem: tomllib.loads(p.read_text())["kind"] for p in (REPO_ROOT / "workloads").glob("*.toml")}
    assert table == files


def test_the_trace_formats_are_those_the_docs_list():
    from sim.workloads.trace import trace_formats

    rows = set(re.findall(r"^\| `([a-z]+)` \|", WORKLOADS[WORKLOADS.index("| `format` |") + 5:], re.M))
    assert rows | {"auto"} == set(trace_formats.names())
    listed = re.search(r"`format` \(([^)]*)\)", WORKLOADS).group(1)
    assert set(re.findall(r"`([a-z]+)`", listed)) == set(trace_formats.names())


def test_mooncake_hash_ids_are_modelled_as_the_docs_say(tmp_path):
    """workloads/README.md: `hash_ids` (one per 512 prompt tokens: the prompt's pieces, which engines with a
    prefix cache reuse). Two rows sharing their first hash id share their first 512-token piece."""
    from sim.workloads import build_workload

    assert "one per 512 prompt tokens: the prompt's pieces, which engines with a prefix cache reuse" in WORKLOADS
    assert "not modelled" not in WORKLOADS[WORKLOADS.index("| `mooncake` |"):].split("\n")[0]
    f = tmp_path / "t.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in [
        {"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [7, 8]},
        {"timestamp": 10, "input_length": 600, "output_length": 5, "hash_ids": [7, 9]}]) + "\n")
    specs = build_workload({"kind": "trace", "file": str(f), "format": "mooncake", "arrivals": "timestamps"}, seed=1)
    a, b = (sp.prefix for sp in specs)
    assert [n for _, n in a] == [512, 488] and [n for _, n in b] == [512, 88]
    assert a[0] == b[0] and a[1][0] != b[1][0]


def test_the_disaggregated_engines_are_those_the_readme_names():
    from sim.engine import disagg

    bullet = _bullet(README, "Clusters and disaggregation")
    named = set(re.findall(r"`([a-z0-9-]+)`", bullet[:bullet.index("has no disaggregated prefill")]))
    assert named - {"vllm-v0"} == set(disagg.ENGINES) and "vllm-v0" not in disagg.ENGINES
    assert "FastPP's scheduler" not in bullet


def test_the_gpus_the_readme_names_have_kernel_data():
    """README, measured ranges: "Vidur's A100/H100/A40 profiles ... or (H100, H200, B200; `profiles/aic/`) from
    AIConfigurator's tables": every GPU spec is one of them, and the AIConfigurator GPUs are its folders."""
    bullet = _bullet(README, "Measured ranges")
    vidur = set(re.search(r"Vidur's ([A-Z0-9/]+) profiles", bullet).group(1).split("/"))
    aic = set(re.search(r"\(([A-Z0-9, ]+); `profiles/aic/`\)", bullet).group(1).split(", "))
    short = lambda name: name.split("-")[0].upper()  # noqa: E731  (h100-sxm-80gb -> H100)
    specs = {short(p.stem) for p in (REPO_ROOT / "profiles" / "gpus").glob("*.toml")}
    assert specs == vidur | aic
    assert {short(p.name) for p in (REPO_ROOT / "profiles" / "aic").iterdir() if p.is_dir()} == aic
