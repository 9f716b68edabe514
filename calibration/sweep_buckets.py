"""Factors per graph bucket that no served pass showed, from the sweep's own shape around its line.

A mixed-graph pass is priced by one line in its padded tokens, and the serving section's level is fitted where the
calibration runs' passes mostly are: the bucket of their token budget (768). The sweep times every bucket, and about
the line they differ by a shape that repeats from model to model and card to card: the 768-token graph runs 2-3%
under the line, the 1,024-token one about on it, the 832-token one 7-13% over it. A budget of 1,024 then serves its
full chunks 3-4% over their price (calibration/VALIDATION.md, fifty-fourth round). Each bucket the section has no
served factor for takes the nearest served bucket's factor (on a path with none, the reference bucket's, at 1) times
the sweep's ratio of the two. ``python -m sim.sweep_buckets`` writes a profile so filled, its hosts simulated again.
"""

from __future__ import annotations

import numpy as np

from calibration.profile import Profile, point_features
from calibration.serving import BUCKET_PATHS, ServingModel


def sweep_bucket_shape(profile: Profile, min_count: int = 10) -> tuple[dict[int, float], dict[int, int]]:
    """({bucket: median of measured / the line's price}, {bucket: points}) over the profile's swept mixed-graph
    passes (with decodes and without; one graph per bucket), for buckets of ``min_count`` points or more."""
    target = profile.fit.get("target", "wall_s")
    ratios: dict[int, list[float]] = {}
    for point in profile.points:
        f = point_features(point)
        if profile.model.path(f) != "mixed-graph" or not point.get(target):
            continue
        ratios.setdefault(profile.model.bucket(f), []).append(point[target] / profile.model.predict(f))
    counts = {b: len(r) for b, r in sorted(ratios.items()) if b and len(r) >= min_count}
    return {b: float(np.median(ratios[b])) for b in counts}, counts


def with_sweep_buckets(profile: Profile, reference: int, min_count: int = 10) -> Profile:
    """``profile`` with each bucketed path's missing factors filled from the sweep (``sweep_bucket_shape``): the
    factor of the nearest bucket the path has one for, times shape(bucket) / shape(that bucket); on a path with none,
    shape(bucket) / shape(``reference``), the bucket its level was fitted at. Served factors stay; those an earlier
    fill made are made again."""
    if profile.serving is None:
        raise ValueError("the profile has no serving section whose paths to price per bucket")
    shape, counts = sweep_bucket_shape(profile, min_count)
    if reference not in shape:
        raise ValueError(f"the sweep has {counts.get(reference, 0)} mixed-graph passes in the {reference}-token "
                         f"bucket, fewer than {min_count}: choose a reference bucket of {sorted(shape) or 'none'}")
    section = _served_only(profile.serving)
    scales, filled = {}, {}
    for path in BUCKET_PATHS:
        own = section.bucket_scale.get(path, {})
        anchors = {b: f for b, f in own.items() if b in shape} or {reference: 1.0}
        nearest = {b: min(anchors, key=lambda a, b=b: (abs(a - b), a)) for b in shape if b not in own}
        added = {b: anchors[a] * shape[b] / shape[a] for b, a in nearest.items()}
        if added:
            scales[path] = dict(sorted({**own, **added}.items()))
            filled[path] = sorted(added)
    fit = {"reference": reference, "points": counts, "filled": filled}
    serving = section.with_bucket_scale(scales, fit, key="sweep_buckets")
    return profile.with_serving(serving).with_hosts(profile.hosts)


def with_served_buckets(profile: Profile, scales, fit) -> Profile:
    """``profile`` with served factors ``scales`` and their ``fit`` (``fit_bucket_scales``) for their paths, its
    hosts kept; where its buckets were filled from the sweep, those the served factors lack are filled again."""
    filled = profile.serving.fit.get("sweep_buckets")
    serving = _served_only(profile.serving).with_bucket_scale(scales, fit)
    served = profile.with_serving(serving).with_hosts(profile.hosts)
    return with_sweep_buckets(served, filled["reference"]) if filled else served


def _served_only(serving: ServingModel) -> ServingModel:
    """``serving`` without the factors per bucket an earlier fill from the sweep made (its fit's "sweep_buckets")."""
    filled = serving.fit.get("sweep_buckets")
    if not filled:
        return serving
    d = serving.to_dict()
    scales = {path: {b: f for b, f in factors.items() if b not in filled["filled"].get(path, [])}
              for path, factors in serving.bucket_scale.items()}
    fit = {k: v for k, v in d["fit"].items() if k != "sweep_buckets"}
    return ServingModel.from_dict({**d, "bucket_scale": {p: {str(b): f for b, f in s.items()}
                                                         for p, s in scales.items() if s}, "fit": fit})
