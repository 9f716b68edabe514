"""What a sampled pass saves since its profile's sweep (``calibration.sampler_saved``): the fit, the profile's
prices with it (sampled passes less, greedy ones as before), the file round trip and the CLI."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from calibration.profile import load_profile
from calibration.sampler_saved import fit_saved, main, measure
from engine.policy import PassFeatures


def decode(batch: int, context: int = 1000) -> PassFeatures:
    return PassFeatures(num_tokens=batch, prefill_tokens=0, decode_tokens=batch, num_seqs=batch, prefill_seqs=0,
                        decode_context=batch * context, prefill_attention=0, num_samples=batch)


def test_the_saving_is_a_line_in_the_sampled_entries_never_below_nothing():
    batches = [1, 16, 64, 128, 256]
    swept = [0.010 + 20e-6 * n for n in batches]
    engine = [0.0098 + 2e-6 * n for n in batches]
    assert fit_saved(batches, swept, engine) == (pytest.approx(0.2e-3), pytest.approx(18e-6))
    # a negative intercept is dropped and the slope refitted through 0
    per_pass, per_sample = fit_saved(batches, [0.0 + 10e-6 * n for n in batches], [1e-4 + 0 * n for n in batches])
    assert per_pass == 0.0 and 0 < per_sample < 10e-6
    with pytest.raises(ValueError, match="two or more batches"):
        fit_saved([1], [0.01], [0.009])


def test_a_sampled_pass_costs_the_saving_less_and_a_greedy_one_as_before():
    shipped = load_profile("llama-3-8b-h200-bf16")
    saved = shipped.with_serving(shipped.serving.with_sampler_saved(0.3e-3, 15e-6, {"card": "test"}))
    f = decode(128)
    assert shipped.predict(f, 0.0) - saved.predict(f, 0.0) == pytest.approx(0.3e-3 + 128 * 15e-6)
    for kind in ("step", "ahead", "discarded"):
        assert saved.greedy_seconds(f, kind, saved.predict(f, 0.0)) == pytest.approx(
            shipped.greedy_seconds(f, kind, shipped.predict(f, 0.0)))
    nothing = f._replace(num_samples=0)
    assert saved.predict(nothing, 0.0) == shipped.predict(nothing, 0.0)
    back = saved.serving.from_dict(saved.serving.to_dict())
    assert (back.sampler_saved_s, back.sampler_saved_per_sample_s) == (0.3e-3, 15e-6)
    assert "sampler_saved_s" not in shipped.serving.to_dict()  # a section without it keeps its older form


def test_apply_writes_the_fitted_saving_and_keeps_the_hosts(tmp_path):
    batches = [1, 64, 256]

    def measured(name: str, per_sample: float) -> str:
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"model": "llama-3-8b", "batches": batches,
                                    "median_s": [0.008 + per_sample * n for n in batches],
                                    "meta": {"card": "NVIDIA H200", "git_commit": name, "date": "2026-11-30"}}))
        return str(path)

    out = tmp_path / "saved.json"
    args = ["apply", "llama-3-8b-h200-bf16", "--swept", measured("then", 20e-6), "--engine", measured("now", 4e-6),
            "--out", str(out)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    profile, shipped = load_profile(out), load_profile("llama-3-8b-h200-bf16")
    assert profile.serving.sampler_saved_per_sample_s == pytest.approx(16e-6)
    assert profile.serving.fit["sampler_saved"]["swept_commit"] == "then"
    assert profile.hosts.to_dict() == shipped.hosts.to_dict()
    other = CliRunner().invoke(main, ["apply", "llama-2-7b-h200-bf16", *args[2:]])
    assert other.exit_code != 0 and "the measurements are of llama-3-8b" in other.output


def test_measure_times_full_batch_decode_steps_on_this_engine():
    result = measure("tiny-llama", batches=[1, 4], prompt_len=8, steps=6, device="cpu")
    assert result["vocab_size"] == 320 and min(result["count"]) >= 6
    assert all(s > 0 for s in result["median_s"])
