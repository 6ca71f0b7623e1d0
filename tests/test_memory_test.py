"""The admission memory test (system model 1.8) against the artifact's algorithm written out in
full: the scheduler decides many tests by a bound and builds the sorted states only when the
bound cannot, so both must give the artifact's answer on every call of an admission round."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.engine.schedulers.fastpp import PrefillAdder

from conftest import make_req, make_sched


class ArtifactMemoryTest:
    """add_one_req_ignore_eos's test, as SGLang 0.4.1 + FastPP run it: the states of the first
    test are the request, every visible running request and the pieces already admitted, sorted
    by tokens left; each later request is inserted (a new largest lands before the last)."""

    def __init__(self, sched, margin: int) -> None:
        self.sched, self.margin, self.states = sched, margin, None

    def passes(self, req, rem: float, can_run) -> bool:
        margin = self.margin
        if self.states is None:
            reqs = [req] + [r for s in self.sched.slots if s.running for r in s.running] + [r for r, _ in can_run]
            states = [(r.max_new - r.out_len + margin, r.prompt_len + r.out_len) for r in reqs]
            self.states = sorted([x for x in states if x[0] > 0], key=lambda x: x[0])
        else:
            st_ = (req.max_new - req.out_len + margin, req.prompt_len + req.out_len)
            if st_[0] > 0:
                i = 0
                for i in range(len(self.states)):
                    if st_[0] <= self.states[i][0]:
                        break
                self.states.insert(i, st_)
        states = self.states
        if not states:
            return True
        tokens_freed = 0
        for i, (left, ctx) in enumerate(states):
            bs = len(states) - i
            if i + 1 < len(states):
                cur_need = states[i + 1][0]
            else:
                cur_need = left
            if rem + tokens_freed - req.prompt_len - cur_need * bs <= 0:
                return False
            tokens_freed += ctx
        return True


@st.composite
def rounds(draw):
    slots = draw(st.integers(1, 4))
    sched = make_sched(pp=slots, kv=10**9, chunk=10**6)
    rid = 0
    for s in sched.slots:
        if draw(st.booleans()):
            s.running = []
            for _ in range(draw(st.integers(0, 40))):
                out = draw(st.integers(1, 300))
                r = make_req(rid, draw(st.integers(1, 3000)), output=out)
                r.out_len = draw(st.integers(0, out))  # (finished ones still in the list too)
                s.running.append(r)
                rid += 1
    waiting = []
    for _ in range(draw(st.integers(1, 12))):
        # (outputs up to 2,000: later requests often have the most tokens left, the insertion quirk)
        r = make_req(rid, draw(st.integers(1, 3000)), output=draw(st.integers(1, 2000)))
        waiting.append(r)
        rid += 1
    chunked = None
    if draw(st.booleans()):
        chunked = make_req(rid, draw(st.integers(2, 5000)), output=draw(st.integers(1, 300)))
        chunked.prefix_len = draw(st.integers(0, chunked.fill_len - 1))
    # pools from far too small to ample, so both the bound and the full walk decide
    need = sum(r.prompt_len + r.max_new for s in sched.slots if s.running for r in s.running)
    need += sum(r.prompt_len + r.max_new for r in waiting)
    sched.kv_free = draw(st.integers(0, 2 * need + 10) | st.integers(need // 4, need + 10))
    return sched, waiting, chunked


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
@given(rounds())
def test_memory_test_equals_the_artifacts_on_every_call(case):
    sched, waiting, chunked = case
    adder = PrefillAdder(sched, 0)
    if chunked is not None:
        adder.add_chunked(chunked)
    ref = ArtifactMemoryTest(sched, sched.num_slots - 1)
    for req in waiting:
        expected = ref.passes(req, adder.cur_rem, list(adder.can_run))
        assert adder._passes_memory_test(req) == expected
        if not expected:
            break
        # admit it as add_one would after the test (budgets only), and go on
        new = req.fill_len - req.prefix_len
        adder.can_run.append((req, new))
        adder._take(new, min(req.max_new, 4096))
        if adder.cur_rem <= 0:
            break
