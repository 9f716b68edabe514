"""What a sampled pass saves since its profile's sweep (``calibration.sampler_saved``): the fit, the profile's
prices with it (sampled passes less, greedy ones as before), the file round trip and the CLI."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from calibration.profile import load_profile
from calibration.sampler_saved import fit_saved, main, measure
from calibration.serving import ServingModel
from engine.policy import PassFeatures


def decode(batch: int, context: int = 1000) -> PassFeatures:
    return PassFeatures(num_tokens=batch, prefill_tokens=0, decode_tokens=batch, num_seqs=batch, prefill_seqs=0,
                        decode_context=batch * context, prefill_attention=0, num_samples=batch)


def run(median_s, model: str = "llama-3-8b", batches=(1, 64, 256), commit: str = "x", vocab: int = 128256,
        chunked: bool = False) -> dict:
    return {"model": model, "vocab_size": vocab, "batches": list(batches), "median_s": list(median_s),
            "chunked": chunked, "prompt_len": 256,
            "meta": {"card": "NVIDIA H200", "commit": commit, "date": "2026-11-30"}}


def test_the_saving_is_the_mean_difference_per_batch_never_below_nothing():
    batches, seconds = fit_saved([run([0.010, 0.012, 0.020]), run([0.012, 0.012, 0.022])],
                                 [run([0.0095, 0.0125, 0.016])])
    assert batches == [1, 64, 256] and seconds == [pytest.approx(1.5e-3), 0.0, pytest.approx(5e-3)]
    with pytest.raises(ValueError, match="same batches"):
        fit_saved([run([0.01, 0.01, 0.01])], [run([0.01, 0.01], batches=(1, 64))])
    with pytest.raises(ValueError, match="one vocabulary"):
        fit_saved([run([0.01, 0.01, 0.01])], [run([0.01, 0.01, 0.01], model="llama-2-7b", vocab=32000)])
    with pytest.raises(ValueError, match="same passes"):
        fit_saved([run([0.01] * 3)], [run([0.01] * 3, chunked=True)])
    # a batch no pass held is left out
    assert fit_saved([run([0.01, 0.01, float("nan")])], [run([0.009, 0.009, float("nan")])])[0] == [1, 64]
    # models of one vocabulary pool
    assert fit_saved([run([0.01] * 3, model="llama-2-7b", vocab=32000)],
                     [run([0.009] * 3, model="llama-2-13b", vocab=32000)])[1] == pytest.approx([1e-3] * 3)


def test_a_sampled_pass_costs_the_saving_less_and_a_greedy_one_as_before():
    shipped = load_profile("llama-3-8b-h200-bf16")
    section = {k: v for k, v in shipped.serving.to_dict().items() if k != "sampler_saved"}
    shipped = shipped.with_serving(ServingModel.from_dict(section))  # as swept, nothing saved
    table = {"batches": [1, 64, 256], "seconds": [0.1e-3, 1.0e-3, 3.0e-3]}
    saved = shipped.with_serving(shipped.serving.with_sampler_saved({"decode": table}))
    for batch, less in ((1, 0.1e-3), (32, 0.1e-3 + 31 / 63 * 0.9e-3), (128, 1.0e-3 + 64 / 192 * 2e-3), (300, 3e-3)):
        f = decode(batch)
        assert shipped.predict(f, 0.0) - saved.predict(f, 0.0) == pytest.approx(less)
        for kind in ("step", "ahead", "discarded"):
            assert saved.greedy_seconds(f, kind, saved.predict(f, 0.0)) == pytest.approx(
                shipped.greedy_seconds(f, kind, shipped.predict(f, 0.0)))
    nothing = decode(16)._replace(num_samples=0)
    assert saved.predict(nothing, 0.0) == shipped.predict(nothing, 0.0)
    # a pass with prompt tokens: the decode table, until the section has one of its own
    mixed = decode(16)._replace(num_tokens=528, prefill_tokens=512, num_seqs=17, prefill_seqs=1,
                                prefill_attention=512 * 300)
    assert shipped.predict(mixed, 0.0) - saved.predict(mixed, 0.0) == pytest.approx(0.1e-3 + 15 / 63 * 0.9e-3)
    both = shipped.with_serving(shipped.serving.with_sampler_saved(
        {"decode": table, "mixed": {"batches": [1], "seconds": [0.05e-3]}}))
    assert shipped.predict(mixed, 0.0) - both.predict(mixed, 0.0) == pytest.approx(0.05e-3)
    assert both.predict(decode(128), 0.0) == pytest.approx(saved.predict(decode(128), 0.0))
    back = saved.serving.from_dict(saved.serving.to_dict())
    assert back.sampler_saved == {"decode": table}
    assert "sampler_saved" not in shipped.serving.to_dict()  # a section without it keeps its older form


@pytest.mark.parametrize("bad,match", [
    ({"mixed": {"batches": [1], "seconds": [0.0]}}, "a decode and maybe a mixed table"),
    ({"decode": {"batches": [1], "seconds": [0.0]}, "eager": {}}, "a decode and maybe a mixed table"),
    ({"decode": {"batches": [1, 64]}}, "batches and seconds"),
    ({"decode": {"batches": [64, 1], "seconds": [0.0, 0.0]}}, "increasing"),
    ({"decode": {"batches": [0, 1], "seconds": [0.0, 0.0]}}, "increasing"),
    ({"decode": {"batches": [1, 2], "seconds": [0.0]}}, "as many seconds"),
    ({"decode": {"batches": [1, 2], "seconds": [0.0, -1e-3]}}, "finite number >= 0"),
])
def test_a_malformed_saving_is_refused_by_name(bad, match):
    d = load_profile("llama-3-8b-h200-bf16").serving.to_dict()
    with pytest.raises(ValueError, match=match):
        ServingModel.from_dict({**d, "sampler_saved": bad})


def test_apply_writes_the_measured_saving_and_keeps_the_hosts(tmp_path):
    def measured(name: str, per_sample: float, chunked: bool = False) -> str:
        path = tmp_path / f"{name}.json"
        seconds = [0.008 + per_sample * n for n in (1, 64)] + [float("nan") if chunked else 0.008 + per_sample * 256]
        path.write_text(json.dumps(run(seconds, commit=name, chunked=chunked)))
        return str(path)

    out = tmp_path / "saved.json"
    args = ["apply", "llama-3-8b-h200-bf16", "--swept", measured("then", 20e-6), "--swept", measured("again", 22e-6),
            "--engine", measured("now", 4e-6), "--swept", measured("then-mixed", 14e-6, chunked=True),
            "--engine", measured("now-mixed", 4e-6, chunked=True), "--out", str(out)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    profile, shipped = load_profile(out), load_profile("llama-3-8b-h200-bf16")
    assert profile.serving.sampler_saved["decode"]["seconds"] == pytest.approx([17e-6 * n for n in (1, 64, 256)])
    assert profile.serving.sampler_saved["mixed"] == {"batches": [1, 64], "seconds": pytest.approx([10e-6, 640e-6])}
    assert profile.serving.fit["sampler_saved"]["mixed"]["engine_s"][0][2] is None
    assert profile.serving.fit["sampler_saved"]["swept_commit"] == "then"
    assert profile.hosts.to_dict() == shipped.hosts.to_dict()
    other = CliRunner().invoke(main, ["apply", "llama-2-7b-h200-bf16", *args[2:]])
    assert other.exit_code != 0 and "the profile's model llama-2-7b has 32000" in other.output


def test_measure_times_full_batch_decode_steps_on_this_engine():
    result = measure("tiny-llama", batches=[1, 4], prompt_len=8, steps=6, device="cpu")
    assert result["vocab_size"] == 320 and min(result["count"]) >= 6
    assert all(s > 0 for s in result["median_s"])
    chunked = measure("tiny-llama", batches=[4], prompt_len=8, steps=6, device="cpu", chunked=True)
    assert chunked["chunked"] and chunked["count"][0] >= 1 and chunked["median_s"][0] > result["median_s"][1]


@pytest.mark.parametrize("batches", ["a,2", "0,4", "8,4", ""])
def test_measure_refuses_batches_that_are_not_increasing_sizes(batches, tmp_path):
    result = CliRunner().invoke(main, ["measure", "--model", "tiny-llama", "--device", "cpu", "--batches", batches,
                                       "--out", str(tmp_path / "m.json")])
    assert result.exit_code == 2 and "increasing batch sizes" in result.output
    assert not (tmp_path / "m.json").exists()
