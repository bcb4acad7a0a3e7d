"""latency_cdf.png and over_time.png: written beside the Parquet files, read back as images, the same bytes for the
same run."""

from __future__ import annotations

import numpy as np
from serve_requests import requests_file

import stepsim


def test_latency_cdf_png_is_written_read_back_and_reproducible(tmp_path):
    from matplotlib.image import imread

    trace = requests_file(tmp_path / "t.parquet", np.arange(40) * 0.05, 100, np.arange(1, 41))
    runs = [stepsim.serve("qwen3-30b-a3b", trace, out=tmp_path / name, iteration_latency=0.01,
                          slo="ttft=30ms,tpot=15ms") for name in ("a", "b")]
    png = tmp_path / "a" / "latency_cdf.png"
    assert runs[0].files["latency_cdf"] == png
    assert png.read_bytes() == (tmp_path / "b" / "latency_cdf.png").read_bytes()
    image = imread(png)
    assert image.shape == (360, 1200, 4)
    assert (image[..., :3] < 0.9).any()  # something is drawn
    over = tmp_path / "a" / "over_time.png"
    assert runs[0].files["over_time"] == over and over.read_bytes() == (tmp_path / "b" / "over_time.png").read_bytes()
    assert imread(over).shape == (360, 800, 4)  # no request waits at this load: two panels, the third a caption
