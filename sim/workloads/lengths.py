"""Length sources: where a `poisson` workload's (prompt, output) token lengths come from.

A `[lengths]` table picks a `source`:

- `pairs`: explicit lists, reused in order (cycled), as the artifact reuses a fixed request set.
- `quantile-table`: i.i.d. draws from a committed fitted model in `sim/data/lengths_<table>.csv`
  (see `sim.workloads.fit_lengths` for the format); `joint = true` (default) keeps the
  prompt/output dependence, `joint = false` samples the two marginals independently.
- `sharegpt`: the `sharegpt` quantile table plus the artifact's ShareGPT filter
  (4 <= prompt <= 1024, output >= 4, prompt + output <= 2048), enforced by redrawing.
- `lognormal`: independent lognormals given mean and CV, clipped to a range (synthetic CNN).

Every source accepts `swap = true` (prompt and output exchanged, the artifact's `--reverse`).
"""

from __future__ import annotations

from sim.core.lazy import lazy

from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

np = lazy("numpy")  # imported on first use (sim/core/lazy.py)

from sim.core.errors import ConfigError, DataError
from sim.workloads.base import MAX_REQUEST_TOKENS

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
SOURCES = ("pairs", "quantile-table", "sharegpt", "lognormal")

# The artifact's ShareGPT sampler filter (vLLM/SGLang bench_serving), see fastpp-system-model §6.4.
SHAREGPT_FILTER = {"min_prompt": 4, "max_prompt": 1024, "min_output": 4, "max_total": 2048}


def _check_keys(table: Mapping[str, Any], allowed: set[str], where: str) -> None:
    # Unknown keys are almost always typos; silently ignoring them would change a run unnoticed.
    extra = sorted(set(table) - allowed)
    if extra:
        raise ConfigError(f"{where}: unknown field {extra[0]!r}; allowed: {', '.join(sorted(allowed))}")


def lengths_from_pairs(params: Mapping[str, Any], where: str) -> tuple[np.ndarray, np.ndarray]:
    prompts = params.get("prompt_tokens")
    outputs = params.get("output_tokens")
    if not isinstance(prompts, list) or not isinstance(outputs, list) or not prompts:
        raise ConfigError(f"{where}: 'pairs' lengths need non-empty lists prompt_tokens and output_tokens")
    if len(prompts) != len(outputs):
        raise ConfigError(f"{where}: prompt_tokens and output_tokens differ in length")
    for key, vals in (("prompt_tokens", prompts), ("output_tokens", outputs)):
        for v in vals:
            if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= MAX_REQUEST_TOKENS:
                raise ConfigError(f"{where}: field {key!r} must hold integers in [1, {MAX_REQUEST_TOKENS}], got {v!r}")
    return np.asarray(prompts, dtype=np.int64), np.asarray(outputs, dtype=np.int64)


# ---------------------------------------------------------------- quantile tables


class QuantileTable:
    """A fitted joint length model (see `sim.workloads.fit_lengths` for how it is made).

    `u` is a probability grid; `prompt[u]` the prompt quantile function; `output[u]` the
    marginal output quantile function; `cond[b][u]` the output quantile function among the
    rows whose prompt rank falls in the b-th of B equal-mass bins.
    """

    def __init__(self, u: np.ndarray, prompt: np.ndarray, output: np.ndarray, cond: np.ndarray):
        self.u, self.prompt, self.output, self.cond = u, prompt, output, cond

    @property
    def num_bins(self) -> int:
        return self.cond.shape[0]

    def sample(self, num: int, rng: np.random.Generator, *, joint: bool = True) -> tuple[np.ndarray, np.ndarray]:
        # Inverse-transform sampling with piecewise-linear quantile functions. The prompt's
        # uniform u also picks its rank bin, whose conditional output quantiles carry the
        # dependence (a rank-binned copula; it keeps ShareGPT's rank correlation of -0.41).
        u = rng.random(num)
        v = rng.random(num)
        prompts = np.interp(u, self.u, self.prompt)
        if joint:
            bins = np.minimum((u * self.num_bins).astype(np.int64), self.num_bins - 1)
            outputs = np.empty(num)
            for b in range(self.num_bins):
                sel = bins == b
                outputs[sel] = np.interp(v[sel], self.u, self.cond[b])
        else:
            outputs = np.interp(v, self.u, self.output)
        return _to_tokens(prompts), _to_tokens(outputs)


def _to_tokens(x: np.ndarray) -> np.ndarray:
    return np.maximum(np.rint(x), 1).astype(np.int64)


def table_path(name: str) -> Path:
    return DATA_DIR / f"lengths_{name}.csv"


def available_tables() -> list[str]:
    return sorted(p.stem.removeprefix("lengths_") for p in DATA_DIR.glob("lengths_*.csv"))


@lru_cache(maxsize=None)
def load_quantile_table(name: str) -> QuantileTable:
    path = table_path(name)
    if not path.is_file():
        raise ConfigError(f"unknown length table {name!r}; allowed: {', '.join(available_tables())}")
    with path.open() as fh:
        header = fh.readline().strip().split(",")
        rows = np.loadtxt(fh, delimiter=",", ndmin=2)
    cond_cols = [i for i, h in enumerate(header) if h.startswith("output_b")]
    if header[:3] != ["u", "prompt", "output"] or not cond_cols or rows.shape[1] != len(header):
        raise DataError(f"{path}: line 1: expected columns u,prompt,output,output_b0,...; got {','.join(header)}")
    return QuantileTable(rows[:, 0], rows[:, 1], rows[:, 2], rows[:, cond_cols].T.copy())


def _sample_table(lengths: Mapping[str, Any], num: int, rng, where: str, table: str, filt=None):
    joint = lengths.get("joint", True)
    if not isinstance(joint, bool):
        raise ConfigError(f"{where}: field 'joint' must be true or false, got {joint!r}")
    model = load_quantile_table(table)
    prompts, outputs = model.sample(num, rng, joint=joint)
    if filt is None:
        return prompts, outputs
    # Redraw the pairs the artifact's filter would have dropped (rejection keeps the filtered
    # distribution exact; interpolation only ever breaks the sum limit, and rarely).
    for _ in range(1000):
        bad = (
            (prompts < filt["min_prompt"]) | (prompts > filt["max_prompt"])
            | (outputs < filt["min_output"]) | (prompts + outputs > filt["max_total"])
        )
        if not bad.any():
            return prompts, outputs
        prompts[bad], outputs[bad] = model.sample(int(bad.sum()), rng, joint=joint)
    raise DataError(f"{table_path(table)}: length model cannot satisfy the ShareGPT filter")


# ---------------------------------------------------------------- lognormal


def _lognormal(spec: Any, num: int, rng, where: str) -> np.ndarray:
    if not isinstance(spec, dict):
        raise ConfigError(f"{where}: must be a table {{mean = ..., cv = ..., clip = [lo, hi]}}, got {spec!r}")
    _check_keys(spec, {"mean", "cv", "clip"}, where)
    vals = {}
    for key in ("mean", "cv"):
        v = spec.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ConfigError(f"{where}: field {key!r} must be a number > 0, got {v!r}")
        vals[key] = float(v)
    clip = spec.get("clip", [1, 2**31 - 1])
    if (
        not isinstance(clip, list) or len(clip) != 2
        or not all(isinstance(c, int) and not isinstance(c, bool) for c in clip)
        or not 0 < clip[0] <= clip[1]
    ):
        raise ConfigError(f"{where}: field 'clip' must be [lo, hi] integers with 0 < lo <= hi, got {clip!r}")
    # Moment matching: CV^2 = exp(sigma^2) - 1 and mean = exp(mu + sigma^2 / 2).
    sigma2 = np.log1p(vals["cv"] ** 2)
    mu = np.log(vals["mean"]) - sigma2 / 2
    x = rng.lognormal(mu, np.sqrt(sigma2), size=num)
    return np.clip(np.rint(x), clip[0], clip[1]).astype(np.int64)


# ---------------------------------------------------------------- dispatch


def sample_lengths(lengths: Any, num: int | None, rng: np.random.Generator, where: str):
    """(prompts, outputs) for `num` requests from a `[lengths]` table.

    For `pairs`, `num = None` means one request per pair; other sources need `num`.
    """
    if not isinstance(lengths, dict):
        raise ConfigError(f"{where}: field 'lengths' must be a table, got {lengths!r}")
    where_l = f"{where} [lengths]"
    source = lengths.get("source", "pairs")
    common = {"source", "swap"}
    if source == "pairs":
        _check_keys(lengths, common | {"prompt_tokens", "output_tokens"}, where_l)
        prompts, outputs = lengths_from_pairs(lengths, where_l)
        idx = np.arange(len(prompts) if num is None else num) % len(prompts)
        prompts, outputs = prompts[idx], outputs[idx]
    elif source in ("quantile-table", "sharegpt", "lognormal"):
        if num is None:
            raise ConfigError(f"{where}: field 'num_requests' is required with lengths.source = {source!r}")
        if source == "quantile-table":
            _check_keys(lengths, common | {"table", "joint"}, where_l)
            table = lengths.get("table")
            if table not in available_tables():
                raise ConfigError(
                    f"{where_l}: field 'table' must be one of: {', '.join(available_tables())}; got {table!r}"
                )
            prompts, outputs = _sample_table(lengths, num, rng, where_l, table)
        elif source == "sharegpt":
            _check_keys(lengths, common | {"joint"}, where_l)
            prompts, outputs = _sample_table(lengths, num, rng, where_l, "sharegpt", SHAREGPT_FILTER)
        else:
            _check_keys(lengths, common | {"prompt", "output"}, where_l)
            prompts = _lognormal(lengths.get("prompt"), num, rng, f"{where_l} field 'prompt'")
            outputs = _lognormal(lengths.get("output"), num, rng, f"{where_l} field 'output'")
    else:
        raise ConfigError(f"{where}: field 'lengths.source' must be one of: {', '.join(SOURCES)}; got {source!r}")
    swap = lengths.get("swap", False)
    if not isinstance(swap, bool):
        raise ConfigError(f"{where_l}: field 'swap' must be true or false, got {swap!r}")
    return (outputs, prompts) if swap else (prompts, outputs)
