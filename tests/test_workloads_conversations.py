"""Workloads with prefix identities: conversations (synthetic and from a ShareGPT file) and a
shared system prompt; Mooncake hash ids as pieces."""

from __future__ import annotations

import json

import pytest

from sim.core.errors import ConfigError, DataError
from sim.workloads import build_workload
from sim.workloads.base import output_piece


def test_a_turn_resends_the_conversation_so_far(tmp_path):
    f = tmp_path / "sg.json"
    f.write_text(json.dumps([{"conversations": [{"from": "human", "value": "a" * 40}, {"from": "gpt", "value": "b" * 80},
                                                {"from": "human", "value": "c" * 20}, {"from": "gpt", "value": "d" * 8}]}]))
    reqs = build_workload({"kind": "conversation", "file": str(f), "rate_rps": 1.0, "num_sessions": 1,
                           "think_time_s": 0.0, "reply_time_s": 1.0}, seed=1)
    first, second = reqs
    # 40 chars = 10 tokens, reply 20, then 5 and 2 (4 characters a token)
    assert (first.prompt_tokens, first.output_tokens) == (10, 20)
    assert (second.prompt_tokens, second.output_tokens) == (10 + 20 + 5, 2)
    assert second.prefix[0] == first.prefix[0] and second.prefix[1] == (output_piece(first.req_id), 20)
    assert second.arrival_s == pytest.approx(first.arrival_s + 1.0)


def test_synthetic_sessions_and_their_context_limit():
    reqs = build_workload({"kind": "conversation", "rate_rps": 2.0, "num_sessions": 30, "turns_mean": 3.0,
                           "max_context_tokens": 4096}, seed=2)
    assert all(r.prompt_tokens + r.output_tokens <= 4096 for r in reqs)
    assert [r.req_id for r in reqs] == list(range(len(reqs)))
    assert all(reqs[i].arrival_s <= reqs[i + 1].arrival_s for i in range(len(reqs) - 1))
    outs = {output_piece(r.req_id) for r in reqs}
    later = [r for r in reqs if any(p in outs for p, _n in r.prefix)]
    assert later  # some turns re-send an earlier reply
    for r in reqs:
        assert sum(n for _p, n in r.prefix) == r.prompt_tokens


def test_shared_prefix_reuse():
    reqs = build_workload({"kind": "shared-prefix", "rate_rps": 5.0, "num_requests": 200, "prefix_tokens": 100,
                           "num_prefixes": 2, "reuse": 0.5}, seed=3)
    shared = [r for r in reqs if len(r.prefix) == 2]
    assert 70 < len(shared) < 130 and len({r.prefix[0] for r in shared}) == 2
    assert all(r.prefix[0][1] == 100 for r in shared)


def test_mooncake_hash_ids_become_512_token_pieces(tmp_path):
    f = tmp_path / "m.jsonl"
    f.write_text(json.dumps({"timestamp": 0, "input_length": 1100, "output_length": 3, "hash_ids": [7, 8, 9]}) + "\n")
    (r,) = build_workload({"kind": "trace", "file": str(f), "format": "mooncake", "arrivals": "timestamps"}, seed=1)
    assert r.prefix == ((7, 512), (8, 512), (9, 76))


@pytest.mark.parametrize("bad, needle", [({"turns_mean": 0}, "turns_mean"), ({"num_sessions": -1}, "num_sessions"),
                                         ({"bogus": 1}, "unknown field 'bogus'")])
def test_bad_conversation_fields_are_one_line(bad, needle):
    with pytest.raises(ConfigError, match=needle):
        build_workload({"kind": "conversation", "rate_rps": 1.0, "num_sessions": 2, **bad}, seed=1)


def test_a_sharegpt_file_without_conversations_is_a_data_error(tmp_path):
    f = tmp_path / "x.json"
    f.write_text("[1, 2]")
    with pytest.raises(DataError, match="conversations"):
        build_workload({"kind": "conversation", "file": str(f), "rate_rps": 1.0, "num_sessions": 1}, seed=1)
