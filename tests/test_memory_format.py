"""benchmarks/scale/memory_format.py: the two layouts train the same function (weights equal to
float rounding after a step from the same start), and its page states the ratio it measured."""

from benchmarks.scale import memory_format as mf


def test_the_layouts_agree_to_rounding_and_the_page_shows_the_ratio():
    family, tier, settings = mf.MODELS["cnn tier 2 (privacy, server_opt, foundation)"]
    r = mf.measure("cnn", family, tier, settings, repeats=2, n=1)
    assert r["one_step_max_weight_difference"] < 1e-4  # the same update, another summation order
    assert len(r["nchw_ms"]) == len(r["channels_last_ms"]) == 2
    assert abs(r["ratio"] - r["channels_last_ms_median"] / r["nchw_ms_median"]) < 0.01
    results = {"machine": {"cores": 2, "date": "d", "loadavg_1_5_15": [0, 0, 0]},
               "machine_after": [0, 0, 0], "command": "c", "torch": "t", "capability": "AVX2",
               "models": [r]}
    page = "\n".join(mf.page(results))
    assert f"**{r['ratio']:.2f}×**" in page and "AVX2" in page
