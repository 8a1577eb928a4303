"""The lines a nightly run prints: plain text, one configuration per line, every number with
what it was compared against."""

from __future__ import annotations

from tuner.nightly.compare import Verdict
from tuner.nightly.judge import Findings
from tuner.nightly.measure import ProbeResult
from tuner.nightly.plan import BASELINE_ROLE
from tuner.nightly.plan import INCUMBENT
from tuner.stats import mad
from tuner.stats import median


def lines(f: Findings, conclusion: str) -> list[str]:
    """Each configuration, its failures, then ``conclusion`` (the verdict or why there is none)
    and what else a reader should know."""
    versus = {r.probe.key: v for r, v in f.challengers}
    out = [_probe_line(r, f, versus.get(r.probe.key)) for r in f.results]
    out += _failures(f.results)
    out.append(conclusion)
    if f.per_user and f.per_user.regressed:
        out.append(f"also slower at concurrency 1: tok/s per user {_against(f.per_user)}")
    if f.regressed and f.baseline:
        out.append(_where(f.baseline))
    if f.winner:
        out += _winner_lines(f)
    if f.env_changes:
        out.append("environment changed since the last nightly run: " + "; ".join(f.env_changes))
    return out


def summary(f: Findings) -> str:
    """One sentence: the verdict on the incumbent (also stored as the run's message)."""
    v, metric = f.verdict, f"output tok/s at concurrency {f.target}"
    if v is None:
        today = _num(median(f.results[0].values))
        return f"ok: first measurement of the incumbent ({metric} {today}); it is the reference"
    if f.rebased:
        return f"ok (rebased): today's {metric}, {_num(v.today)}, starts a new reference"
    if v.regressed:
        return (f"REGRESSION: the incumbent's {metric} fell {-v.change:.1%} "
                f"({_num(v.reference.median)} -> {_num(v.today)}), beyond the {v.tolerance:.1%} "
                "that noise allows")
    word = "faster beyond noise" if v.improved else "within noise"
    return f"ok: the incumbent's {metric} is {v.change:+.1%} ({word}; {_source(v)})"


def _probe_line(r: ProbeResult, f: Findings, vs_incumbent: Verdict | None) -> str:
    head = f"{_title(r)}: {r.probe.label}"
    if not r.values:
        return f"{head}: not measured ({len(r.failures)} failed repeats)"
    own = {INCUMBENT: f.verdict, BASELINE_ROLE: f.baseline}.get(r.probe.role)
    spread = f"median of {len(r.values)}, MAD {_num(mad(r.values))}"
    parts = [f"{_num(median(r.values))} tok/s @{f.target} ({spread})"]
    if own:
        parts.append(_against(own))
    if vs_incumbent:
        parts.append(f"{vs_incumbent.change:+.1%} vs the incumbent today "
                     f"(noise allows {vs_incumbent.tolerance:.1%})")
    return f"{head}: " + "; ".join(parts)


def _where(baseline: Verdict) -> str:
    """Whether plain decoding slowed down too: the engine or machine, or speculation alone."""
    if baseline.regressed:
        return (f"the baseline (no speculation) is slower too ({baseline.change:+.1%}): look at "
                "the engine, driver or machine rather than speculation")
    return (f"the baseline (no speculation) is not ({baseline.change:+.1%}): look at what "
            "speculation depends on (drafter, acceptance, speculative kernels)")


def _winner_lines(f: Findings) -> list[str]:
    r, v = f.winner
    text = (f"a different configuration now wins: {_title(r)}, {r.probe.label}, gives "
            f"{_num(v.today)} tok/s @{f.target}, {v.change:+.1%} over the incumbent today "
            f"(beyond the {v.tolerance:.1%} noise allows; within the SLA)")
    if not f.winner_command:
        return [text]
    return [text, "launch it with:", f.winner_command]


def _failures(results: list[ProbeResult]) -> list[str]:
    return [f"{_title(r)}: {len(r.failures)} of {r.probe.repeats} repeats failed "
            f"(first: {r.failures[0]})" for r in results if r.failures]


def _title(r: ProbeResult) -> str:
    if r.probe.role == INCUMBENT:
        return "incumbent"
    if r.probe.role == BASELINE_ROLE:
        return "baseline (no speculation)"
    return f"neighbour ({r.probe.change})"


def _against(v: Verdict) -> str:
    return f"{v.change:+.1%} vs {_num(v.reference.median)} ({_source(v)})"


def _source(v: Verdict) -> str:
    return f"{v.reference.source}; noise allows {v.tolerance:.1%}"


def _num(x: float) -> str:
    return f"{x:,.1f}"
