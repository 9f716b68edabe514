"""Measured points -> a ``Profile``: a seeded held-out split per sweep, the fit on the rest, the errors on both,
the spread of repeated pass times as the noise the simulator draws from, and, where the sweep measured each pass's
joules, the energy model (``calibration.energy``) fitted and scored on the same split."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from calibration import cost_model
from calibration.decode_table import fit_decode_table
from calibration.energy import EnergyModel, fit_energy
from calibration.profile import Profile

TARGET = "wall_s"
MAX_NOISE_SAMPLES = 2001


def split_points(points: Sequence[Mapping], heldout_frac: float = 0.2, seed: int = 0) -> list[str]:
    """'train' or 'heldout' for each point: ``heldout_frac`` of each sweep kind, chosen at random. The decode
    table fits a line per batch size, so a size's shortest and longest context stay in training (held out, one of
    them left that size's line to extrapolate); a drawn one is swapped for another point of the kind, drawn from a
    second generator so that the other kinds' draws stay as they were."""
    rng = np.random.default_rng(seed)
    labels = ["train"] * len(points)
    kinds: dict[str, list[int]] = {}
    for i, p in enumerate(points):
        kinds.setdefault(p.get("sweep", "all"), []).append(i)
    kept = table_extremes(points)
    swap = np.random.default_rng([seed, 1])
    for idx in kinds.values():
        k = int(round(heldout_frac * len(idx)))
        drawn = [int(i) for i in rng.choice(idx, size=k, replace=False)]
        free = [i for i in idx if i not in kept and i not in drawn]
        for j, i in enumerate(drawn):
            if i in kept and free:
                drawn[j] = free.pop(int(swap.integers(len(free))))
        for i in drawn:
            if i not in kept:
                labels[i] = "heldout"
    return labels


def table_extremes(points: Sequence[Mapping]) -> set[int]:
    """Indices of the decode-table points with the shortest and the longest context of their batch size."""
    sizes: dict[int, list[int]] = {}
    for i, p in enumerate(points):
        if p.get("sweep") == "decode-table":
            sizes.setdefault(int(p["num_seqs"]), []).append(i)
    kept = set()
    for idx in sizes.values():
        kept.add(min(idx, key=lambda i: points[i]["decode_context"]))
        kept.add(max(idx, key=lambda i: points[i]["decode_context"]))
    return kept


def columns(points: Sequence[Mapping], names: Sequence[str]) -> dict[str, np.ndarray]:
    return {n: np.array([float(p[n]) for p in points]) for n in names}


def noise_ratios(points: Sequence[Mapping], key: str = "wall_repeats", target: str = TARGET) -> list[float]:
    """Each repeat over its point's median, pooled and thinned to quantiles (tails kept)."""
    ratios = [r / p[target] for p in points for r in (p.get(key) or []) if p[target] > 0]
    if not ratios:
        return []
    ratios = np.sort(np.array(ratios))
    if ratios.size > MAX_NOISE_SAMPLES:
        ratios = np.quantile(ratios, np.linspace(0.0, 1.0, MAX_NOISE_SAMPLES))
    return [round(float(r), 5) for r in ratios]


def fit_path(X: Mapping[str, np.ndarray], y: np.ndarray, knots, seed: int) -> tuple[cost_model.HingeModel, dict]:
    """One path's model: the given knots (no floor), or the candidate chosen by cross-validation; the knees chosen
    by cross-validation either way (none under 25 points)."""
    if len(y) < 25:
        return cost_model.fit(X, y, knots or cost_model.DEFAULT_KNOTS), {"chosen": "fixed"}
    if knots is not None:
        knees = cost_model.select_knees(X, y, knots, seed=seed)
        return cost_model.fit(X, y, knots, knees=knees), {"chosen": "fixed", "knees": knees}
    name, scores, knees = cost_model.select(X, y, seed=seed)
    knots, floor = cost_model.CANDIDATES[name]
    return cost_model.fit(X, y, knots, floor, knees), {"chosen": name, "cv_scores": scores, "knees": knees}


def graph_max_batch(points: Sequence[Mapping], meta: Mapping) -> int:
    """The largest decode batch the engine replays as a graph: seen in the points, else from the metadata.
    Mixed-graph points (``graph_tokens`` set) also have ``graph`` set and do not count."""
    seen = [p["num_seqs"] for p in points
            if p.get("graph") and p.get("graph_tokens") is None and p["num_tokens"] == p["num_seqs"]]
    return max(seen) if seen else int(meta.get("graph_max_batch", 0))


def path_mismatches(model: cost_model.PassModel, points: Sequence[Mapping]) -> int:
    """How many points the engine ran another way than ``model`` assumes, by their recorded ``graph`` and
    ``graph_tokens`` (a point without them counts as agreeing)."""
    X = columns(points, ("num_tokens", "num_seqs"))
    paths = model.paths(X)
    tokens = cost_model.padded(X, model.mixed_buckets)["num_tokens"] if model.mixed_buckets else X["num_tokens"]
    bad = 0
    for p, path, t in zip(points, paths, tokens):
        if "graph" in p and bool(p["graph"]) != (path != "eager"):
            bad += 1
        elif "graph_tokens" in p and p["graph_tokens"] != (t if path == "mixed" else None):
            bad += 1
    return bad


def build_profile(points: Sequence[Mapping], meta: Mapping, block_size: int, num_kv_blocks: int,
                  max_model_len: int, *, heldout_frac: float = 0.2, seed: int = 0,
                  knots: Sequence[float] | None = None, target: str = TARGET) -> Profile:
    """Fit each path on its training points, score on the held-out ones, and bundle it all into a ``Profile``.

    Paths: decode graph, mixed graph (if ``meta["mixed_graph_buckets"]`` lists buckets; fitted with each pass's
    tokens padded to its bucket) and eager. A path with fewer than 3 training points borrows another's fit.
    Without ``knots``, each path's form is chosen by cross-validation on its training points alone."""
    points = [cost_model.with_unknown_contexts(p) for p in points]
    if len(points) < 10:
        raise ValueError(f"only {len(points)} points: too few to fit and hold some out")
    for p, label in zip(points, split_points(points, heldout_frac, seed)):
        p["split"] = label
    train = [p for p in points if p["split"] == "train"]
    held = [p for p in points if p["split"] == "heldout"]
    max_batch = graph_max_batch(points, meta)
    buckets = cost_model.check_buckets(meta.get("mixed_graph_buckets") or [])
    X_train = columns(train, cost_model.FEATURES)
    y_train = np.array([p[target] for p in train])
    on_graph, on_mixed = cost_model.path_masks(X_train, max_batch, buckets)
    X_padded = cost_model.padded(X_train, buckets) if buckets else X_train
    models, selection = {}, {}
    for path, mask, X_path in (("graph", on_graph, X_train), ("mixed", on_mixed, X_padded),
                               ("eager", ~(on_graph | on_mixed), X_train)):
        if path == "mixed" and not buckets:
            continue
        if mask.sum() < 3:  # a path the sweep (nearly) never took: borrow another's fit
            selection[path] = {"n": int(mask.sum())}
            continue
        X = {n: v[mask] for n, v in X_path.items()}
        models[path], info = fit_path(X, y_train[mask], knots, seed)
        selection[path] = {"n": int(mask.sum()), **info}
    if not models:
        raise ValueError("too few points on every path to fit")

    def pick(path: str, *others: str) -> cost_model.HingeModel:
        name = next(n for n in (path, *others) if n in models)
        if name != path:
            selection[path]["borrowed"] = name
        return models[name]

    mixed = pick("mixed", "eager", "graph") if buckets else None
    # the decode table: from the table sweep's batches alone (contexts spread as served; the grid's are equal)
    tabled = on_graph & np.array([p.get("sweep") == "decode-table" for p in train], dtype=bool)
    table = fit_decode_table(X_train["num_seqs"][tabled], X_train["decode_context"][tabled], y_train[tabled])
    if table is not None:
        selection.setdefault("graph", {})["decode_table_sizes"] = len(table.seqs)
    model = cost_model.PassModel(pick("graph", "eager", "mixed"), pick("eager", "mixed", "graph"), max_batch,
                                 mixed, buckets, table)
    fit = {"target": target, "heldout_frac": heldout_frac, "seed": seed, "selection": selection,
           "train": cost_model.error_stats(cost_model.relative_errors(model, X_train, y_train))}
    fit["path_mismatches"] = path_mismatches(model, points)
    if held:
        X_held = columns(held, cost_model.FEATURES)
        y_held = np.array([p[target] for p in held])
        rel = cost_model.relative_errors(model, X_held, y_held)
        fit["heldout"] = cost_model.error_stats(rel)
        by_sweep = {}
        for kind in sorted({p.get("sweep", "all") for p in held}):
            mask = np.array([p.get("sweep", "all") == kind for p in held])
            by_sweep[kind] = cost_model.error_stats(rel[mask])
        fit["heldout_by_sweep"] = by_sweep
        paths = model.paths(X_held)
        fit["heldout_by_path"] = {path: cost_model.error_stats(rel[paths == path])
                                  for path in ("graph", "mixed", "eager") if path != "mixed" or buckets}
    else:
        fit["heldout"] = cost_model.error_stats(np.array([]))
    return Profile(meta, block_size, num_kv_blocks, max_model_len, model, points=points,
                   noise=noise_ratios(points, target=target), fit=fit, energy=energy_from_points(train, held, meta))


# What a points file added to a profile must share with it: the same model, precision and card, measured as the
# profile's points were (KV block size, context length, mixed-graph buckets, KV layout), with the value a key takes
# where a header or meta does not name it (sweeps before 5ea3698 name no KV layout: theirs was fresh).
SAME_MEASUREMENT = {"model": None, "dtype": None, "card": None, "block_size": None, "max_model_len": None,
                    "mixed_graph_buckets": None, "kv_layout": "fresh"}


def refit(profile: Profile, added: tuple[Mapping | None, Sequence[Mapping]] | None = None) -> Profile:
    """``profile`` fitted again from its own points with this code (its split seed, held-out share and target),
    keeping what the points do not hold: meta, serving, energy and hosts sections. The serving and hosts sections
    were measured against the old cost model; ``splitfuse validate --from ... --fit-serving`` measures both again
    from the runs it names.

    ``added``: (header, points) of a points file (``calibration.sweep.read_points``) to fit together with the
    profile's own, measured on the same card (``SAME_MEASUREMENT``); passes the profile already holds (same key)
    are an error. They come after the profile's points, so the held-out draw of each sweep kind the profile holds
    stays as it was where they are of new kinds; ``meta["added_points"]`` records each such file."""
    if len(profile.points) < 10:
        raise ValueError(f"{profile.source or 'the profile'} holds {len(profile.points)} points: nothing to refit")
    fit, meta = profile.fit, dict(profile.meta)
    points = [{k: v for k, v in p.items() if k != "split"} for p in profile.points]
    if added is not None:
        header, extra = added
        if header is None or not extra:
            raise ValueError("the added points file has no header or no points: not a points file of "
                             "`splitfuse profile`")
        for key, unnamed in SAME_MEASUREMENT.items():
            theirs, ours = header.get(key, unnamed), meta.get(key, unnamed)
            if theirs != ours:
                raise ValueError(f"the added points were measured with {key} {theirs!r}, the profile's with "
                                 f"{ours!r}: fit them only with points of the same measurement")
        held = {p["key"] for p in points}
        again = [p["key"] for p in extra if p["key"] in held]
        if again:
            raise ValueError(f"the added points repeat {len(again)} of the profile's passes (first {again[0]}); "
                             "measure them again as rounds of the profile's own points file instead")
        points += [dict(p) for p in extra]
        kinds = sorted({p.get("sweep", "all") for p in extra})
        meta["added_points"] = [*meta.get("added_points", []),
                                f"{len(extra)} points ({', '.join(kinds)}) measured on {header.get('card')}, "
                                f"{header.get('date')}, commit {header.get('git_commit')}"]
    fresh = build_profile(points, meta, profile.block_size, profile.num_kv_blocks, profile.max_model_len,
                          heldout_frac=fit.get("heldout_frac", 0.2), seed=fit.get("seed", 0),
                          target=fit.get("target", TARGET))
    return Profile(meta, profile.block_size, profile.num_kv_blocks, profile.max_model_len, fresh.model,
                   points=fresh.points, noise=fresh.noise, fit=fresh.fit, serving=profile.serving,
                   energy=profile.energy, hosts=profile.hosts)


def energy_from_points(train: Sequence[Mapping], held: Sequence[Mapping], meta: Mapping) -> EnergyModel | None:
    """The energy model fitted on the training points that carry joules (``calibration.sweep.pass_energy``),
    with its error on the held-out ones; None where the sweep measured no energy (no NVML) or too few points."""
    train = [p for p in train if p.get("joules") is not None]
    held = [p for p in held if p.get("joules") is not None]
    if "idle_w" not in meta or len(train) < 10:
        return None
    names = ("num_tokens", "decode_context", "prefill_attention")

    def data(points):
        return (columns(points, names), np.array([p["energy_pass_s"] for p in points]),
                np.array([p["joules"] for p in points]))

    X, seconds, joules = data(train)
    model = fit_energy(X, seconds, joules, meta["idle_w"], meta.get("power_limit_w"),
                       {"source": "swept", "method": "each pass replayed back to back under NVML's energy counter "
                                                     "(calibration.sweep.pass_energy)"})
    if held:
        X, seconds, joules = data(held)
        model.fit["heldout"] = cost_model.error_stats(model.predict_array(seconds, X) / joules - 1.0)
    return model
