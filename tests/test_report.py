"""evo report: the HTML page and its plots, rendered in headless Chromium.

The Chromium test needs Debian's chromium (/usr/bin/chromium; `apt-get install -y chromium`)
and is skipped with that reason without it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from _inspect_run import TASK, build_run
from evo.cli import app as evo_app
from evo.results.report import PLOTS, build_report, progress_series
from evo.store import Store, UnknownIdError

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    built = build_run(tmp / "evo.db", tmp / "cache")
    with Store.open_reader(built.db) as store:
        res = build_report(store, built.run_id, tmp / "out")
    return built, res


def _png_stats(path: Path) -> tuple[int, int, float]:
    """(width, height, pixel standard deviation) of a PNG, decoded by Pillow."""
    from PIL import Image, ImageStat

    with Image.open(path) as im:
        im.load()
        gray = im.convert("L")
        return im.width, im.height, ImageStat.Stat(gray).stddev[0]


def test_report_writes_page_and_valid_nonblank_plots(report):
    built, res = report
    assert res.index.is_file() and set(res.plots) == set(PLOTS)
    for name, path in res.plots.items():
        data = path.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000, name
        w, h, sd = _png_stats(path)
        assert w >= 400 and h >= 200 and sd > 5, (name, w, h, sd)  # not a blank canvas
    html = res.index.read_text()
    for name in PLOTS:
        assert f'id="plot-{name}" src="{name}.png"' in html
    assert built.run_id in html and TASK in html and "$0.7500" in html
    assert "compile_error 1" in html and "confirmed" in html


def test_report_notes_what_it_cannot_draw(report):
    _, res = report
    # every champion is drawable in the synthetic run
    assert not any("roofline" in n for n in res.notes), res.notes


def test_progress_series_steps_per_island(report):
    built, _ = report
    with Store.open_reader(built.db) as store:
        cands = {c.id: c for c in store.candidates(built.run_id)}
        series = progress_series(cands, store.evaluations(built.run_id))
    assert series[TASK][0] == [(1, 1.0), (2, pytest.approx(1.2))]
    assert series[TASK][1] == [(6, pytest.approx(1.5))]
    assert series["kb21_sigmoid"] == {}


def test_unknown_run_and_report_for_a_run_without_timings(tmp_path):
    from evo.core.records import Candidate, Evaluation, StageResult, Status

    with Store(tmp_path / "evo.db") as store:
        rid = store.create_run("bare", {}, seed=0, config_hash="")
        c = Candidate.create(TASK, "// k\n", operator="seed")
        store.add_candidate(rid, c)
        store.add_evaluation(rid, Evaluation(c.id, (StageResult("timing", Status.OK),), 1.0))
    with Store.open_reader(tmp_path / "evo.db") as store:
        with pytest.raises(UnknownIdError, match="recent runs"):
            build_report(store, "nope", tmp_path / "x")
        res = build_report(store, rid, tmp_path / "out")
    assert any("no timing metrics" in n for n in res.notes)
    assert any("no champion row" in n for n in res.notes)
    assert all(p.stat().st_size > 0 for p in res.plots.values())


def test_cli_report(report, tmp_path):
    built, _ = report
    app = evo_app
    res = CliRunner().invoke(app, ["report", built.run_id, "--out", str(tmp_path / "r"), "--db", str(built.db),
                                   "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert Path(out["index"]).is_file() and set(out["plots"]) == set(PLOTS)
    res = CliRunner().invoke(app, ["report", built.run_id, "--out", str(tmp_path / "r"), "--db", str(built.db),
                                   "--gpu", "V100"])
    assert res.exit_code == 2 and "unknown GPU" in res.output


def _chromium(args: list[str], tmp: Path) -> subprocess.CompletedProcess:
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp / 'chromium-profile'}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (/usr/bin/chromium): apt-get install -y chromium")
def test_report_renders_in_headless_chromium(report, tmp_path):
    _, res = report
    # A copy of the page with a script that records, after load, whether Chromium decoded
    # each plot (naturalWidth > 0); --dump-dom prints the DOM after scripts ran.
    probe = res.index.parent / "probe.html"
    script = ("<script>window.addEventListener('load', () => { for (const im of document.images) "
              "{ im.setAttribute('data-natural', im.complete ? String(im.naturalWidth) : '0'); } "
              "document.body.setAttribute('data-loaded', 'yes'); });</script>")
    probe.write_text(res.index.read_text().replace("</body>", script + "</body>"))
    try:
        dom = _chromium(["--virtual-time-budget=10000", "--dump-dom", probe.as_uri()], tmp_path)
    finally:
        probe.unlink()
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert 'data-loaded="yes"' in html, html[:2000]
    for name in PLOTS:
        m = re.search(rf'<img[^>]*id="plot-{name}"[^>]*>', html)
        assert m, f"no <img id=plot-{name}> in the rendered DOM"
        natural = re.search(r'data-natural="(\d+)"', m.group(0))
        assert natural and int(natural.group(1)) >= 400, f"Chromium did not decode {name}.png: {m.group(0)}"
    # and the page as a person sees it is not blank
    shot = tmp_path / "shot.png"
    r = _chromium([f"--screenshot={shot}", "--window-size=1200,2400", res.index.as_uri()], tmp_path)
    assert r.returncode == 0 and shot.is_file(), r.stderr[-2000:]
    w, h, sd = _png_stats(shot)
    assert (w, h) == (1200, 2400) and sd > 10
