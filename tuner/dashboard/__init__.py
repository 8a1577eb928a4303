"""Results dashboard: a self-contained HTML report of a study, written once or served.

    write_report("sqlite:///results.db", "pcie8-kimi-sglang", "report.html")
    serve_report("sqlite:///results.db", "pcie8-kimi-sglang", port=8050)  # blocks
"""

from tuner.dashboard.data import load_study_data
from tuner.dashboard.report import build_report
from tuner.dashboard.report import write_report
from tuner.dashboard.serve import make_server
from tuner.dashboard.serve import serve_report

__all__ = ["build_report", "load_study_data", "make_server", "serve_report", "write_report"]
