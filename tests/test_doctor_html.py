"""The HTML report: a self-contained page with one figure per BN layer (the worst first), and,
where Debian's `chromium` is installed, a headless screenshot of it that shows the plots."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from bnfix.doctor.diagnose import diagnose
from bnfix.doctor.record import FinalStats, LayerTrace, Recording, Sample
from bnfix.doctor.report import DoctorReport

pytest.importorskip("matplotlib")


def _recording(rank: int) -> Recording:
    rec = Recording("torch", "Net", 5, rank=rank, world=2, steps=40)
    for name, beta in (("stem.bn", 0.0), ("head.bn", 0.15)):
        samples = [Sample(step=s, batch=4, count=256, gamma_mean=1 - 0.004 * s, gamma_min=0.8,
                          gamma_max=1.2, beta_mean=beta * s / 10, beta_min=-0.1, beta_max=0.3,
                          batch_mean=0.5, running_mean=0.5 * (1 - 0.9 ** s), batch_var=2.0,
                          running_var=1 + 1.0 * (1 - 0.9 ** s), dead=0.01 * s / 5)
                   for s in range(1, 41, 5)]
        rec.layers[name] = LayerTrace(name, "BatchNorm2d", 4, momentum=0.1, updates=40,
                                      samples=samples, probes=[[25, 0.3], [40, 0.1 + rank]],
                                      final=FinalStats(8, [0.5] * 4, [2.0] * 4,
                                                       [0.5 + rank] * 4, [2.0] * 4))
    rec.output_gap = [[25, 0.4], [40, 0.2]]
    return rec


def _page(tmp_path: Path) -> Path:
    from bnfix.doctor.html import render_html

    recordings = [_recording(0), _recording(1)]
    report = DoctorReport(["python", "train.py"], 5, recordings, diagnose(recordings))
    path = tmp_path / "report.html"
    path.write_text(render_html(report), encoding="utf-8")
    return path


def test_the_page_has_the_findings_and_a_figure_per_layer(tmp_path):
    page = _page(tmp_path).read_text()
    assert page.count("data:image/png;base64,") == 2
    assert "<script" not in page and "http" not in page.replace("https://github.com", "")
    assert re.search(r"BN301</a>.*?stem\.bn", page, re.DOTALL)  # small batch, both ranks
    assert "Ranks compared" in page and "BN310" in page  # rank 1's statistics are off by 1
    # layers with findings first, worst first
    assert page.index("id='layer-Net-stem-bn'") > page.index("<table>")


@pytest.mark.skipif(shutil.which("chromium") is None,
                    reason="Debian's chromium is not installed (apt-get install chromium): "
                           "no headless screenshot of the report")
def test_a_headless_browser_shows_the_plots(tmp_path):
    import matplotlib.image

    page = _page(tmp_path)
    shot = tmp_path / "shot.png"
    subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu",
                    "--hide-scrollbars", f"--screenshot={shot}", "--window-size=1200,1400",
                    page.as_uri()], capture_output=True, timeout=120, check=True)
    pixels = matplotlib.image.imread(shot)[..., :3]
    assert pixels.shape[0] == 1400 and pixels.shape[1] == 1200
    coloured = (pixels.max(axis=2) - pixels.min(axis=2)) > 0.3  # the plots' lines and bands
    assert coloured.mean() > 0.002, "no plot visible in the screenshot"
