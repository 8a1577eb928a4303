"""The HTML report: sections, offline, escaping, scale, the server, Optuna compatibility and a
real headless Chromium."""

from __future__ import annotations

import html
import http.client
import importlib.util
import io
import json
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path
from wsgiref.util import setup_testing_defaults

import optuna
import plotly.graph_objects as go
import pytest
from cli_helpers import UNBOUNDED_TTFT
from cli_helpers import write_config

from backends.perf_model.shipped import speedup_error
from tuner import records
from tuner.config import load_config
from tuner.crossover import crossover
from tuner.dashboard import make_server, write_report
from tuner.dashboard.data import load_study_data
from tuner.dashboard.figures import concurrency
from tuner.dashboard.nightly import load_nightly
from tuner.dashboard.page import figure_html
from tuner.dashboard.roofline import Roofline
from tuner.errors import NoResultError
from tuner.records import nightly
from tuner.runner import run_study

REPO = Path(__file__).resolve().parents[2]
HOSTILE = "<script>alert(1)</script>"
HOSTILE_PATH = "/models/<img src=x onerror=alert(2)>"
HOSTILE_LOG = "</pre><script>alert(3)</script>"
SECTIONS = ["pareto", "concurrency", "acceptance", "breakdown", "importance", "failures", "nightly"]


def _study(folder: Path, **sections) -> str:
    # A 12-trial study has nothing that serves 128 requests without queueing: the SLA's TTFT
    # bounds (tests/tuner_tests/test_best_report.py) would leave nothing to choose.
    sections["workload"] = {**UNBOUNDED_TTFT, **sections.get("workload", {})}
    cfg = load_config(write_config(folder, **sections))
    run_study(cfg)
    return cfg.study.storage


def _crash(url: str, study: str, number: int, excerpt: str) -> None:
    record = records.TrialRecord(trial_number=number, backend="model", params={"tp_size": 8},
                                 status="crash", measured=True, command="", env={},
                                 log_excerpt=excerpt, measurements={})
    records.save_trial(records.connect(url), study, record, [])


@pytest.fixture(scope="module")
def studied(tmp_path_factory) -> tuple[str, str]:
    """A 12-trial model-backend study with a hostile name, model path and log; its report."""
    folder = tmp_path_factory.mktemp("dash")
    url = _study(folder, study={"name": HOSTILE, "n_trials": 12}, model={"path": HOSTILE_PATH})
    _crash(url, HOSTILE, 999, HOSTILE_LOG)
    return url, write_report(url, HOSTILE, folder / "out" / "report.html").read_text()


def _figures(report: str) -> set[str]:
    return set(re.findall(r'<div id="fig-([a-z]+)"', report))


def test_report_has_every_view_and_draws_the_study(studied):
    _, report = studied
    for anchor in SECTIONS:
        assert f'<section id="{anchor}">' in report
    assert {"pareto", "concurrency", "breakdown", "importance", "failures"} <= _figures(report)
    assert "chosen (what `best` emits)" in report and "roofline (ideal step)" in report
    assert "no nightly runs yet" in report


def test_report_is_offline_with_plotly_inlined_once(studied):
    _, report = studied
    assert not re.search(r"<script[^>]*\ssrc=", report)
    assert not re.search(r"<link[^>]*https?://", report)
    assert report.count("Plotly.newPlot(") == len(_figures(report))
    assert report.count("<script>") == 1 + len(_figures(report))  # plotly.js, then one per figure


def test_user_strings_are_escaped_everywhere(studied):
    _, report = studied
    for hostile in (HOSTILE, HOSTILE_PATH, HOSTILE_LOG, "alert(1)</", "<img"):
        assert hostile not in report
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in report  # the name is shown, as text
    assert "&lt;img src=x onerror=alert(2)&gt;" in report
    assert "&lt;/pre&gt;&lt;script&gt;alert(3)" in report


def test_figure_text_cannot_close_its_script_element():
    fig = go.Figure(go.Scatter(x=[1], y=[2], text=["</script><script>alert(4)</script>"]))
    fig.update_layout(title="<!-- </script>")
    out = figure_html("fig-x", fig)
    assert out.count("</script>") == 1 and "<!--" not in out
    payload = out[out.index("var f = ") + 8:out.index("; Plotly.newPlot")]
    assert json.loads(payload)["data"][0]["text"] == ["</script><script>alert(4)</script>"]


def test_chosen_heads_the_front_and_its_roofline_step_is_faster_than_the_modelled_one(studied):
    data = load_study_data(studied[0], HOSTILE)
    assert data.chosen is not None and data.front[0] == data.chosen
    chosen = data.trial(data.chosen)
    assert chosen.feasible and chosen.family is not None
    modelled = sum(chosen.levels[data.target]["breakdown_ms"].values())
    ideal = Roofline(data.config).step_ms(chosen.launch, data.target)
    assert 0 < ideal < modelled


def test_empty_study_gets_a_report_that_says_so(tmp_path):
    url = f"sqlite:///{tmp_path / 'results.db'}"
    records.save_study_config(records.connect(url), "empty", {})
    report = write_report(url, "empty", tmp_path / "r.html").read_text()
    assert "no trials recorded yet" in report and "nothing chosen yet" in report
    assert _figures(report) == set()


def test_missing_db_or_study_raises_and_creates_nothing(tmp_path, studied):
    with pytest.raises(NoResultError, match="no results DB"):
        write_report(f"sqlite:///{tmp_path / 'absent.db'}", "x", tmp_path / "r.html")
    assert not (tmp_path / "absent.db").exists() and not (tmp_path / "r.html").exists()
    with pytest.raises(NoResultError, match="no study named 'typo'"):
        write_report(studied[0], "typo", tmp_path / "r.html")


def test_study_with_only_failures_still_reports(tmp_path):
    # As in test_run_and_best: no H100 KV pool holds one 200K-token Kimi request.
    url = _study(tmp_path, hardware={"gpu": "h100-sxm"}, study={"n_trials": 4},
                 workload={"input_len": 200_000})
    report = write_report(url, "pcie8-kimi-sglang", tmp_path / "r.html").read_text()
    assert _figures(report) == {"failures"}
    assert "all 4 measured trials failed" in report
    assert "needs at least 2 successful trials" in report


def _with_nightly_runs(url: str, folder: Path) -> str:
    """A copy of the study's DB with two nightly runs of the study and one of another."""
    shutil.copy(url.removeprefix("sqlite:///"), folder / "results.db")
    url = f"sqlite:///{folder / 'results.db'}"
    engine = records.connect(url)
    for study, status, value in ((HOSTILE, "ok", 999.0), (HOSTILE, "regression", 998.0),
                                 ("other", "ok", 1.0)):
        run_id = nightly.start_run(engine, study, HOSTILE_PATH, {"tp_size": 8},
                                   "output_tok_s@128", {"host": "h", "driver": "580.1"}, 1, False)
        nightly.finish_run(engine, run_id, status, HOSTILE_LOG, median=value, mad=3.0,
                           n_repeats=5, baseline_median=500.0)
    return url


def test_nightly_history_shows_this_studys_runs_oldest_first(tmp_path, studied):
    """Runs written by tuner.nightly's own records functions, one of another study."""
    url = _with_nightly_runs(studied[0], tmp_path)
    history = load_nightly(records.connect(url), HOSTILE)
    assert [r["median"] for r in history.rows] == [999.0, 998.0]
    assert history.metrics == ["median", "mad", "baseline_median"]  # no reference yet
    assert "fingerprint_json" not in history.columns and "status" in history.columns
    report = write_report(url, HOSTILE, tmp_path / "r.html").read_text()
    assert "nightly" in _figures(report) and "no nightly runs yet" not in report
    assert "output_tok_s@128" in report and "baseline_median" in report
    assert HOSTILE_PATH not in report and HOSTILE_LOG not in report


def test_a_thousand_trial_report_is_fast_and_small(tmp_path):
    spec = importlib.util.spec_from_file_location("bench", REPO / "bench" / "dashboard_bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    url = bench.synthetic_study(tmp_path, 1000, with_optuna=False)
    start = time.perf_counter()
    out = write_report(url, bench.STUDY, tmp_path / "r.html")
    # Generous for a loaded CI machine; bench/dashboard_bench.py holds the 5 s target.
    assert time.perf_counter() - start < 15 and out.stat().st_size < 10e6


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, ""


def test_served_report_answers_and_picks_up_new_trials(studied):
    url, _ = studied
    server = make_server(url, HOSTILE, port=0, refresh_s=3600)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        status, page = _get(base + "/")
        assert status == 200 and "&lt;script&gt;alert(1)" in page
        assert '<meta http-equiv="refresh" content="3600">' in page
        assert _get(base + "/etc/passwd")[0] == 404
        _crash(url, HOSTILE, 1000, "a new failure")
        assert "a new failure" in _get(base + "/")[1]  # the DB changed: rebuilt at once
    finally:
        server.shutdown()
        server.server_close()


def test_serve_report_listens_on_localhost_until_stopped(studied):
    url = studied[0]
    with socket.socket() as s:  # a port free a moment ago; the server takes it right away
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = (f"from tuner.dashboard import serve_report\n"
            f"serve_report({url!r}, {HOSTILE!r}, port={port})")
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
    try:
        deadline, status = time.monotonic() + 60, None
        while time.monotonic() < deadline and status is None:
            try:
                status = _get(f"http://127.0.0.1:{port}/")[0]
            except OSError:
                time.sleep(0.2)
        assert status == 200
    finally:
        proc.terminate()
        err = proc.communicate(timeout=30)[1]
    assert f"http://127.0.0.1:{port}/" in err


def _get_as(port: int, host_header: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.putrequest("GET", "/", skip_host=True)
        conn.putheader("Host", host_header)
        conn.endheaders()
        return conn.getresponse().status
    finally:
        conn.close()


def test_served_report_answers_only_under_its_own_names(studied):
    """DNS rebinding: a page of evil.example whose name now resolves to 127.0.0.1 sends
    `Host: evil.example:PORT`; it must not get the report."""
    server = make_server(studied[0], HOSTILE, port=0, refresh_s=3600)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        for ok in (f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST:{port}"):
            assert _get_as(port, ok) == 200, ok
        for refused in (f"evil.example:{port}", "evil.example", f"127.0.0.1:{port + 1}",
                        "127.0.0.1", f"10.0.0.1:{port}", ""):
            assert _get_as(port, refused) == 403, refused
    finally:
        server.shutdown()
        server.server_close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _dashboard(folder: Path, storage: str, *args: str) -> list[str]:
    config = write_config(folder, study={"storage": storage, "name": HOSTILE})
    return [sys.executable, "-m", "tuner", "dashboard", "-c", str(config), *args]


def test_dashboard_serve_says_serving_once_and_only_when_the_port_answers(studied, tmp_path):
    port = _free_port()
    proc = subprocess.Popen(_dashboard(tmp_path, studied[0], "--serve", "--port", str(port)),
                            cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        while not any("serving" in line for line in lines):
            line = proc.stderr.readline()
            assert line, "".join(lines)  # the process ended without saying it serves
            lines.append(line)
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # answers the moment it says so (before the fix: refused for ~12 s)
        assert _get(f"http://127.0.0.1:{port}/")[0] == 200
    finally:
        proc.terminate()
        rest = proc.communicate(timeout=30)[1]
    assert "".join(lines + [rest]).count("serving") == 1
    assert f"http://127.0.0.1:{port}/" in lines[-1]


def test_dashboard_serve_on_a_busy_port_is_one_line(studied, tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        run = subprocess.run(_dashboard(tmp_path, studied[0], "--serve", "--port", str(port)),
                             cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    assert run.stderr.count("\n") == 1 and f"cannot listen on 127.0.0.1:{port}" in run.stderr
    assert "--port" in run.stderr and "Traceback" not in run.stderr


@pytest.mark.parametrize("where", ["directory", "read-only folder", "file in the way"])
def test_dashboard_out_that_cannot_be_written_is_one_line(studied, tmp_path, where):
    from unwritable import unwritable_folder

    (tmp_path / "a-file").write_text("x")
    out = {"directory": tmp_path,
           "read-only folder": unwritable_folder(tmp_path) / "report.html",
           "file in the way": tmp_path / "a-file" / "report.html"}[where]
    run = subprocess.run(_dashboard(tmp_path, studied[0], "--out", str(out)), cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    assert run.stderr.count("\n") == 1 and str(out) in run.stderr, run.stderr
    assert ("is a directory" if where == "directory" else "cannot write") in run.stderr
    assert run.stdout == "" and not list(tmp_path.glob(".*.tmp"))


def test_our_tables_do_not_break_optuna_or_optuna_dashboard(studied):
    url = studied[0]
    study = optuna.load_study(study_name=HOSTILE, storage=url)
    assert len(study.trials) >= 12
    optuna_dashboard = pytest.importorskip("optuna_dashboard")
    app = optuna_dashboard.wsgi(url)
    listed = json.loads(_wsgi_get(app, "/api/studies"))["study_summaries"]
    assert [s["study_name"] for s in listed] == [HOSTILE]
    detail = json.loads(_wsgi_get(app, f"/api/studies/{listed[0]['study_id']}"))
    assert len(detail["trials"]) == len(study.trials)


def _wsgi_get(app, path: str) -> str:
    environ = {"PATH_INFO": path, "REQUEST_METHOD": "GET", "wsgi.errors": io.StringIO()}
    setup_testing_defaults(environ)
    statuses = []
    body = b"".join(app(environ, lambda status, headers, exc_info=None: statuses.append(status)))
    assert statuses[0].startswith("200"), (statuses, environ["wsgi.errors"].getvalue())
    return body.decode()


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Collects uncaught errors and console.error calls into the DOM, where --dump-dom shows them.
_ERROR_PROBE = """<script>const __errors = [], __error = console.error;
addEventListener("error", e => __errors.push(String(e.message)));
console.error = (...a) => { __errors.push(a.join(" ")); __error(...a); };
addEventListener("load", () => setTimeout(() => { const p = document.createElement("pre");
  p.id = "console-errors"; p.textContent = JSON.stringify(__errors); document.body.append(p);
}, 500));</script>"""


@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium or chromium-browser on PATH "
                    "(.ci/run installs Debian's chromium)")
def test_headless_chromium_draws_the_plot_of_every_section_without_console_errors(
        studied, tmp_path):
    report = write_report(_with_nightly_runs(studied[0], tmp_path), HOSTILE,
                          tmp_path / "r.html").read_text()
    assert _figures(report) == set(SECTIONS)  # with nightly runs, every section has a plot
    page = tmp_path / "probe.html"
    page.write_text(report.replace("<head>", "<head>" + _ERROR_PROBE, 1))
    result = subprocess.run(
        [CHROMIUM, "--headless=new", "--disable-gpu", "--no-sandbox", "--enable-logging=stderr",
         "--v=0", "--virtual-time-budget=15000", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120)
    dom = result.stdout
    errors = re.search(r'<pre id="console-errors">(.*?)</pre>', dom)
    assert errors, result.stderr[-2000:]
    assert json.loads(errors.group(1).replace("&quot;", '"')) == []
    assert "Uncaught" not in result.stderr
    for anchor in SECTIONS:
        drawn = _section(dom, anchor)
        # plotly's own markup once it has drawn: its SVG root, and a group per plotted trace
        assert drawn.count('class="main-svg"') >= 1, anchor
        assert len(re.findall(r'class="trace[ "]', drawn)) >= 1, anchor


def _section(dom: str, anchor: str) -> str:
    start = dom.index(f'<section id="{anchor}">')
    return dom[start:dom.index("</section>", start)]


def test_dashboard_command_writes_the_report_and_prints_its_path(tmp_path):
    from cli_helpers import cli

    config = write_config(tmp_path, study={"n_trials": 4})
    assert cli("run", "-c", str(config), cwd=tmp_path).returncode == 0
    run = cli("dashboard", "-c", str(config), "--out", str(tmp_path / "r.html"), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str(tmp_path / "r.html")
    assert "plotly" in (tmp_path / "r.html").read_text()


def test_the_speedup_panel_shades_parity_within_the_models_error_on_predicted_levels(studied):
    """A model study's speedups are predictions: the lower panel shades 1.0 +- the model's
    speedup error (the shipped fit's); measured levels get no band."""
    url, _ = studied
    data = load_study_data(url, HOSTILE)
    margin = speedup_error(measured_kernels=True)
    assert data.crossover.margin == margin > 0
    bands = concurrency(data).figure.layout.shapes
    assert [(b.y0, b.y1, b.yref) for b in bands if b.type == "rect"] == [
        (pytest.approx(1 / (1 + margin)), pytest.approx(1 + margin), "y2")]
    measured = replace(data, crossover=crossover(data.curves, sampled_for=data.target))
    assert not [b for b in concurrency(measured).figure.layout.shapes if b.type == "rect"]


def test_the_throughput_chart_names_what_to_measure_where_the_model_cannot_call_it(studied):
    """Under the chart, as under `best`'s table: the two configurations to launch and the
    `export` command that prints their launch commands; nothing where every level is called."""
    url, _ = studied
    data = load_study_data(url, HOSTILE)
    close = replace(data.crossover, within_error_at=[data.target], within_error_from=None,
                    to_measure=[(3, "TP8 plain"), (5, "TP8 dflash b4")])
    panel = concurrency(replace(data, crossover=close))
    assert panel.figure is not None
    assert panel.note == (f"to settle it at concurrency {data.target}, measure trial 3 (TP8 "
                          "plain) against trial 5 (TP8 dflash b4) (`dflash-tune export --trial 3 "
                          "--trial 5` has their launch commands)")
    called = replace(data.crossover, within_error_at=[], within_error_from=None, to_measure=[])
    assert concurrency(replace(data, crossover=called)).note == ""


def test_the_throughput_chart_says_under_its_title_when_levels_were_not_searched(studied):
    """A study a real engine measured: the chart's title gains a smaller second line, escaped,
    saying the levels other than the target were not searched; a model study's says only
    where its speedups are within the model's error, if anywhere."""
    url, _ = studied
    data = load_study_data(url, HOSTILE)
    searched = concurrency(data).figure.layout.title.text
    assert "levels other than" not in searched
    said = data.crossover.caveat
    assert searched == html.escape(data.crossover.note) + (
        f"<br><sup>{html.escape(said)}</sup>" if said else "")
    measured = replace(data, crossover=crossover(data.curves, sampled_for=data.target))
    title = concurrency(measured).figure.layout.title.text
    assert title == (f"{html.escape(measured.crossover.note)}<br><sup>levels other than "
                     f"{data.target} show what "
                     f"configurations chosen for {data.target} reached there, not a search of "
                     "each</sup>")
