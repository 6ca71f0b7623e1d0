"""Predictor accuracy (the paper's Table 1): MAPE of per-iteration latency prediction.

`predictor_accuracy(cfg)` simulates `cfg` (use the DCP_pred config on azure-conv) with the
chunk policy wrapped in a recorder that sees what ALP's post-step hook sees, keeps every
training sample ALP would take (an iteration with a prefill in flight, the heaviest in-flight
micro-batch's features (u, D, S, X), kept only when the launched batch is in the same 128
bucket; y = the iteration's wall time), and scores predictors on them:

- `offline`: the start-up table T0(u) alone;
- `offline+prefix`, `offline+prefix+prefill`, `offline+prefix+prefill+decode`: T0(u) plus an
  online RLS (the artifact's lambda, P0 and clipping) on X/2^21, then also S/2^20, then D/1e5;
- `alp`: the artifact's predictor (all three terms and the 0.1 bias feature, i.e. the residual);
- `lstsq`: batch least squares of y - T0(u) on the same four features (numpy.linalg.lstsq);
- `gbm`, `mlp`: scikit-learn GradientBoostingRegressor and a small MLP (32, 32) on
  [T0(u), D, S, X] -> y (skipped, with a message in `df.attrs["skipped"]`, without sklearn).

Protocol: the samples are split in time; batch models are fitted on the first half; online
predictors run prequentially (predict, then update) over all samples; MAPE is measured on the
second half for every predictor. `predict_us` is the mean wall time of one single-sample
prediction call. The ground truth is the run config's own: by default the profile's variance
(stage jitter, host stalls) and structure (decode waves, per-request CPU) that ALP cannot
represent exactly, as a real GPU gives it (profiles/FORMAT.md, `[ground_truth]`). `noise_cv`
overrides the stage jitter for experiments; None (the default) keeps the config's.
"""

from __future__ import annotations

from sim.core.lazy import lazy

import dataclasses
import time

np = lazy("numpy")  # imported on first use (sim/core/lazy.py)
pd = lazy("pandas")  # imported on first use (sim/core/lazy.py)

from sim.core.config import PolicySpec
from sim.policies.base import chunk_policies
from sim.policies.rls import CLIP, FORGET, P0, SCALES, ALPPredictor, RLS, candidate_chunks

LADDER = ("offline", "offline+prefix", "offline+prefix+prefill", "offline+prefix+prefill+decode", "alp")


@chunk_policies.register("recorder")
class Recorder:
    """Wraps another chunk policy and records ALP's training samples: `sink["samples"]` gets
    (u, D, S, X, y) tuples and `sink["table"]` the start-up table. In-process only: `sink` is
    a Python object, not a config value."""

    def __init__(self, context, inner: dict, sink: dict) -> None:
        self.inner = chunk_policies.build(inner["name"], context=context, **dict(inner.get("params", {})))
        self._inner_observe = getattr(self.inner, "observe", None)
        shadow = getattr(self.inner, "predictor", None)
        # NOTE: reuse the inner ALP's table so start-up profiling runs once (it draws noise).
        table = shadow.table if isinstance(shadow, ALPPredictor) else None
        self.shadow = (ALPPredictor(table, candidate_chunks()) if table is not None
                       else ALPPredictor.from_profile(context.startup_profile))
        self.sink = sink
        sink["table"] = self.shadow.table
        sink.setdefault("samples", [])

    def initial_chunk(self) -> int:
        return self.inner.initial_chunk()

    def decide(self, view):
        return self.inner.decide(view)

    def observe(self, view, current, inflight, iteration_s: float) -> None:
        s = self.shadow.sample(current, inflight)
        if s is not None and iteration_s > 0:
            self.sink["samples"].append((*s, iteration_s))
            self.shadow.update(iteration_s, *s)
        if self._inner_observe is not None:
            self._inner_observe(view, current, inflight, iteration_s)


def collect_samples(cfg, noise_cv: float | None = None):
    """Run `cfg` (noise replaced by `noise_cv` unless None); returns (RunResult, table,
    samples) with samples an (n, 5) array of (u, D, S, X, y) in time order."""
    from sim.engine.run import run

    if noise_cv is not None:
        cfg = dataclasses.replace(cfg, latency=dataclasses.replace(cfg.latency, noise_cv=noise_cv))
    sink: dict = {"samples": [], "table": None}
    pol = cfg.scheduler.chunk_policy
    params = dict(pol.params)
    if pol.name == "static":
        params.setdefault("chunk_size_tokens", cfg.scheduler.chunk_size_tokens)
    spec = PolicySpec("recorder", {"inner": {"name": pol.name, "params": params}, "sink": sink})
    cfg = dataclasses.replace(cfg, scheduler=dataclasses.replace(cfg.scheduler, chunk_policy=spec))
    result = run(cfg)
    return result, sink["table"], np.asarray(sink["samples"], dtype=float).reshape(-1, 5)


def _scaled(S: np.ndarray) -> np.ndarray:
    """[D/1e5, S/2^20, X/2^21, 0.1] per sample."""
    return np.column_stack([S[:, 1] / SCALES[0], S[:, 2] / SCALES[1], S[:, 3] / SCALES[2],
                            np.full(len(S), 0.1)])


def _time_calls(fn, rows, reps: int = 2000) -> float:
    n = len(rows)
    t0 = time.perf_counter()
    for i in range(reps):
        fn(rows[i % n])
    return (time.perf_counter() - t0) / reps * 1e6


def _mape(pred: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(np.abs(pred - y) / y) * 100)


def accuracy_table(samples: np.ndarray, table: dict[int, float], train_frac: float = 0.5,
                   seed: int = 1, use_sklearn: bool = True) -> pd.DataFrame:
    """Score the predictors on recorded samples (see the module docstring)."""
    if len(samples) < 10:
        raise ValueError(f"too few predictor samples ({len(samples)}) to score")
    u = samples[:, 0].astype(int)
    y = samples[:, 4]
    base = np.array([table[c] for c in u])
    F = _scaled(samples)  # D, S, X, bias
    split = int(len(samples) * train_frac)
    test = slice(split, None)
    rows = []

    rows.append(("offline", _mape(base[test], y[test]),
                 _time_calls(lambda i: table[int(u[i])], list(range(len(u))))))
    # feature subsets in the order the paper adds them: prefix (X), prefill (S), decode (D), residual
    subsets = {"offline+prefix": [2], "offline+prefix+prefill": [2, 1],
               "offline+prefix+prefill+decode": [2, 1, 0], "alp": [0, 1, 2, 3]}
    for name, cols in subsets.items():
        rls = RLS(len(cols), FORGET, P0, CLIP)
        X = F[:, cols].tolist()
        pred = np.empty(len(y))
        for i in range(len(y)):
            pred[i] = max(base[i] + rls.residual(X[i]), 1e-9)
            rls.update(y[i], base[i], X[i])
        cost = _time_calls(lambda i: max(table[int(u[i])] + rls.residual(X[i]), 1e-9), list(range(len(y))))
        rows.append((name, _mape(pred[test], y[test]), cost))

    coef, *_ = np.linalg.lstsq(F[:split], y[:split] - base[:split], rcond=None)
    pred = base + F @ coef
    rows.append(("lstsq", _mape(pred[test], y[test]),
                 _time_calls(lambda i: table[int(u[i])] + float(F[i] @ coef), list(range(len(y))))))

    skipped = []
    if use_sklearn:
        try:
            from sklearn.compose import TransformedTargetRegressor
            from sklearn.ensemble import GradientBoostingRegressor
            from sklearn.neural_network import MLPRegressor
            from sklearn.pipeline import make_pipeline
            from sklearn.preprocessing import StandardScaler
        except ImportError:
            skipped.append("gbm and mlp skipped: scikit-learn is not installed (pip install 'pipesim[dev]')")
        else:
            Z = np.column_stack([base, samples[:, 1], samples[:, 2], samples[:, 3]])
            models = {
                "gbm": GradientBoostingRegressor(n_estimators=200, max_depth=3, random_state=seed),
                # NOTE: targets in seconds are tiny; the MLP needs a standardised target too.
                "mlp": TransformedTargetRegressor(
                    make_pipeline(StandardScaler(), MLPRegressor(hidden_layer_sizes=(32, 32), max_iter=2000,
                                                                 random_state=seed)),
                    transformer=StandardScaler()),
            }
            for name, model in models.items():
                model.fit(Z[:split], y[:split])
                pred = model.predict(Z[test])
                one = [Z[i:i + 1] for i in range(split, min(split + 200, len(Z)))]
                rows.append((name, _mape(pred, y[test]), _time_calls(model.predict, one, reps=200)))
    df = pd.DataFrame(rows, columns=["predictor", "mape_pct", "predict_us"])
    df.attrs.update(n_samples=len(samples), n_test=len(samples) - split, skipped=skipped)
    return df


def predictor_accuracy(cfg, noise_cv: float | None = None, train_frac: float = 0.5, use_sklearn: bool = True
                       ) -> pd.DataFrame:
    """Simulate `cfg` with a recorder and return the accuracy table (columns predictor,
    mape_pct, predict_us; `attrs`: n_samples, n_test, skipped, status)."""
    result, table, samples = collect_samples(cfg, noise_cv)
    if table is None:
        raise ValueError("no start-up table: some candidate chunk is infeasible for this deployment")
    df = accuracy_table(samples, table, train_frac, seed=cfg.seed, use_sklearn=use_sklearn)
    df.attrs["status"] = result.status
    df.attrs["noise_cv"] = noise_cv
    for msg in df.attrs["skipped"]:
        print(msg)
    return df
