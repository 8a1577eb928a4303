"""The ``dflash-tune`` command. Command bodies are thin: parse, call, render; heavy imports
(optuna, the performance model) happen inside commands so that ``best`` starts fast."""

from __future__ import annotations

import os
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from tuner import engine_cli, render
from tuner.errors import TunerError, UsageError, user_error_code
from tuner.storage import storage_errors

# Plain tracebacks: a server's log is read by people and by backends.server.classify, and Rich's
# boxed, wrapped traceback splits the very lines the classifier looks for.
# Help is click's plain text: Rich's option tables cut long option names at 80 columns.
app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None,
                  help="Tune parallelism and DFlash/DDTree speculation for LLM serving.")

ConfigOpt = Annotated[Path | None, typer.Option(
    "--config", "-c", help="tuner.yaml to read (default: ./tuner.yaml if present, else built-in "
    "defaults for the reference node).")]
StudyOpt = Annotated[str | None, typer.Option("--study", help="Study name (overrides the file).")]
StorageOpt = Annotated[str | None, typer.Option(
    "--storage", help="SQLAlchemy URL of the results DB, e.g. sqlite:///results.db.")]
DEBUG_ENV = "DFLASH_TUNE_DEBUG"  # "1": tracebacks instead of one-line errors, as --debug


def _show_version(value: bool) -> None:
    if value:
        from tuner.version import package_version

        render.emit(f"dflash-tune {package_version()}")
        raise typer.Exit()


@app.callback()
def _options(version: Annotated[bool, typer.Option(
                 "--version", is_eager=True, callback=_show_version,
                 help="Print the version and exit.")] = False,
             debug: Annotated[bool, typer.Option(
                 "--debug", help=f"Show tracebacks instead of one-line errors (or {DEBUG_ENV}=1)."
             )] = False) -> None:
    if debug:
        os.environ[DEBUG_ENV] = "1"  # also what servers this run starts inherit


class OutputFormat(str, Enum):
    shell = "shell"
    json = "json"
    yaml = "yaml"


class Engine(str, Enum):
    sglang = "sglang"
    vllm = "vllm"
    dflash = "dflash"


def _config(path: Path | None, **overrides):
    from tuner.config import load_config

    if path is None and Path("tuner.yaml").is_file():
        path = Path("tuner.yaml")
    return load_config(path, overrides)


@app.command()
def run(config: ConfigOpt = None, backend: Annotated[str | None, typer.Option(
            help="Backend to measure with (model, ...).")] = None,
        trials: Annotated[int | None, typer.Option(
            help="Measured trials the study should hold; a resumed study runs the rest.")] = None,
        storage: StorageOpt = None, study: StudyOpt = None) -> None:
    """Run (or resume) a study and store every trial in the results DB."""
    cfg = _config(config, **{"backend.name": backend, "study.n_trials": trials,
                             "study.storage": storage, "study.name": study})
    from tuner.wiring import prompt_warning

    if warning := prompt_warning(cfg):
        render.note(f"warning: {warning}", "yellow")
    try:
        if cfg.tuning.strategy == "launch_aware":
            from tuner.launches.run import run_launch_aware

            run_launch_aware(cfg)
        else:
            from tuner.runner import run_study

            render.note(f"{run_study(cfg)} trials run")
    except KeyboardInterrupt:
        render.note("interrupted: finished trials are kept; run again to resume", "yellow")
        raise typer.Exit(130)
    from tuner.summary import run_summary

    run_summary(cfg)


@app.command()
def best(config: ConfigOpt = None, study: StudyOpt = None, storage: StorageOpt = None,
         sla: Annotated[list[str] | None, typer.Option(
             help="Limit at the target concurrency, e.g. 'tpot_p50_ms<=30' (repeatable; "
             "replaces the study's sla list; its TTFT bounds stay unless a limit names the "
             "metric).")] = None,
         emit_flags: Annotated[bool, typer.Option(
             "--emit-flags", help="Print only the launch command on stdout.")] = False,
         backend: Annotated[Engine | None, typer.Option(
             help="Engine whose flags to emit (default: the study's).")] = None,
         fmt: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.shell,
         schedule: Annotated[bool, typer.Option(
             "--schedule", help="Print only, as JSON, the best speculation setting per "
             "concurrency band for the chosen configuration's launch.")] = False,
         top: Annotated[int, typer.Option(
             min=1, help="Pareto-front members to show (and return with --format json).")] = 10,
         ) -> None:
    """Pick the best configuration under the SLA and print how to launch it."""
    from tuner.best import find_best, format_command, format_record
    from tuner.summary import show_best

    cfg = _config(config, **{"study.storage": storage, "study.name": study})
    result = find_best(cfg, backend.value if backend else None, sla, top=top)
    if schedule:
        import json

        render.emit(json.dumps(result.schedule(), indent=2))
        return
    if not emit_flags:
        show_best(result)
    else:
        for warning in result.warnings:
            render.note(f"warning: {warning}", "yellow")
        for line in result.evidence():
            render.note(line, "yellow")
    if result.experimental:
        render.note(result.experimental, "yellow")
    render.emit(format_command(result, fmt.value) if emit_flags
                else format_record(result, fmt.value))


class ExportFormat(str, Enum):
    csv = "csv"
    json = "json"
    parquet = "parquet"


@app.command()
def export(config: ConfigOpt = None, study: StudyOpt = None, storage: StorageOpt = None,
           fmt: Annotated[ExportFormat, typer.Option(
               "--format", help="csv: a row per trial and level; json: levels nested; parquet "
               "(needs pyarrow): as csv.")] = ExportFormat.csv,
           out: Annotated[Path | None, typer.Option(help="File to write (default: stdout).")]
           = None,
           trial: Annotated[list[int] | None, typer.Option(
               "--trial", help="Only this trial, by its number (repeatable): e.g. the two "
               "`best` names to measure.")] = None) -> None:
    """Every trial and concurrency level with its metrics, parameters and launch command."""
    from tuner.export import export_study

    cfg = _config(config, **{"study.storage": storage, "study.name": study})
    export_study(cfg, fmt.value, out, trial)


@app.command()
def compare(study_a: Annotated[str, typer.Argument(help="First study (the reference).")],
            study_b: Annotated[str, typer.Argument(help="Second study.")],
            config: ConfigOpt = None, storage: StorageOpt = None,
            storage_b: Annotated[str | None, typer.Option(
                "--storage-b", help="Results DB of STUDY_B (default: the same as STUDY_A's).")]
            = None,
            sla: Annotated[list[str] | None, typer.Option(
                help="Judge both under this SLA instead of each one's own (repeatable).")]
            = None,
            fmt: Annotated[OutputFormat | None, typer.Option(
                "--format", help="json: the comparison on stdout.")] = None) -> None:
    """Two studies' best configurations and their metrics side by side."""
    import json

    from tuner.compare import compare_studies, comparison_dict, show_comparison

    cfg = _config(config, **{"study.storage": storage})
    a, b = compare_studies(cfg, study_a, study_b, storage_b, sla)
    if fmt is OutputFormat.json:
        render.emit(json.dumps(comparison_dict(a, b), indent=2, sort_keys=True))
    else:
        show_comparison(a, b)


@app.command()
def nightly(config: ConfigOpt = None, study: StudyOpt = None, storage: StorageOpt = None,
            backend: Annotated[str | None, typer.Option(
                help="Backend to measure with (default: the study's).")] = None,
            repeats: Annotated[int, typer.Option(min=1, help="Measurements per config.")] = 5,
            explore: Annotated[int, typer.Option(min=0, help="Neighbours to try.")] = 2,
            threshold: Annotated[float, typer.Option(
                help="Smallest relative drop that counts as a regression.")] = 0.05,
            mad_k: Annotated[float, typer.Option("--mad-k", help="Noise multiplier.")] = 3.0,
            history: Annotated[int, typer.Option(min=1, help="Earlier runs to compare with.")]
            = 5,
            rebase: Annotated[bool, typer.Option(
                "--rebase", help="Accept tonight's level as the new reference.")] = False,
            fmt: Annotated[OutputFormat | None, typer.Option("--format")] = None) -> None:
    """Re-measure the incumbent and the baseline; exit 0 fine, 1 regression, 2 unmeasurable."""
    import json

    from tuner.nightly import run_nightly

    cfg = _config(config, **{"study.storage": storage, "study.name": study})
    try:
        with storage_errors(cfg.study.storage):  # a DB that fails mid-run: one line
            outcome = run_nightly(cfg, repeats=repeats, explore=explore, threshold=threshold,
                                  mad_k=mad_k, backend=backend, history=history, rebase=rebase)
    except KeyboardInterrupt:
        render.note("interrupted: what was measured is kept", "yellow")
        raise typer.Exit(130) from None
    for line in outcome.lines:
        render.note(line)
    if fmt is OutputFormat.json:
        render.emit(json.dumps(outcome.as_dict(), indent=2, sort_keys=True))
    raise typer.Exit(outcome.exit_code)


@app.command()
def dashboard(config: ConfigOpt = None, study: StudyOpt = None, storage: StorageOpt = None,
              out: Annotated[Path, typer.Option(help="HTML file to write.")] = Path("report.html"),
              serve: Annotated[bool, typer.Option(
                  "--serve", help="Serve it (rebuilt as the DB changes) instead.")] = False,
              host: str = "127.0.0.1",
              port: Annotated[int, typer.Option(help="8050: optuna-dashboard takes 8080.")] = 8050,
              refresh: Annotated[int, typer.Option(help="Seconds between page reloads.")] = 30,
              compare: Annotated[str | None, typer.Option(
                  help="Draw this second study over the first (Pareto fronts, throughput vs "
                       "concurrency).")] = None,
              storage_b: Annotated[str | None, typer.Option(
                  help="Where the --compare study lives (default: --storage).")] = None,
              ) -> None:
    """Write (or serve) a self-contained HTML report of a study."""
    from tuner.dashboard import serve_report
    from tuner.dashboard import write_report

    cfg = _config(config, **{"study.storage": storage, "study.name": study})
    if compare:
        from tuner.dashboard.overlay import write_overlay

        if serve:
            raise TunerError("--compare writes a file; it cannot be combined with --serve")
        render.emit(str(write_overlay(cfg.study.storage, cfg.study.name, compare, storage_b,
                                      out)))
    elif serve:  # serve_report says where it serves once the port answers
        serve_report(cfg.study.storage, cfg.study.name, host=host, port=port, refresh_s=refresh)
    else:
        render.emit(str(write_report(cfg.study.storage, cfg.study.name, out)))


@app.command()
def calibrate(reference: Annotated[str, typer.Option(
        help="Shipped reference name or a reference YAML file.")] = "pcie8_kimi_sglang",
              study: Annotated[str | None, typer.Option(
                  "--study", help="Fit on this study's own measured levels instead.")] = None,
              holdout: Annotated[float, typer.Option(
                  min=0.0, max=0.5, help="With --study: share of its launches left out of the "
                  "fit and predicted (0.5: every other one).")] = 0.0,
              write: Annotated[bool, typer.Option(
                  "--write", help="Store the fitted constants under backend.efficiency in the "
                  "config file, where `run` reads them.")] = False,
              config: ConfigOpt = None, storage: StorageOpt = None) -> None:
    """Fit the performance model's efficiency constants to measured numbers."""
    from tuner.calibration import calibrate_reference, calibrate_study, write_efficiency

    if study is None:
        eff = calibrate_reference(reference, _config(config))
    else:
        cfg = _config(config, **{"study.storage": storage, "study.name": study})
        eff = calibrate_study(cfg, holdout)
    if write:
        path = config or Path("tuner.yaml")
        write_efficiency(path, eff)
        render.note(f"wrote backend.efficiency to {path}")


class TableOrJson(str, Enum):
    table = "table"
    json = "json"


class EstimateEngine(str, Enum):
    sglang = "sglang"
    vllm = "vllm"


def _estimate_options(command):
    from backends.launch_cli import launch_options
    from tuner.estimate import ESTIMATE_DERIVED, ESTIMATE_KNOBS

    return launch_options(ESTIMATE_KNOBS, derived=ESTIMATE_DERIVED)(command)


@app.command()
@_estimate_options
def estimate(gpu: Annotated[str, typer.Option(help="A GPU of the hardware catalog.")],
             model: Annotated[str, typer.Option(help="Catalog model or a config.json path.")],
             input_len: Annotated[int, typer.Option(min=1)],
             output_len: Annotated[int, typer.Option(min=1)],
             concurrency: Annotated[str, typer.Option(help="Levels, e.g. 1,4,8,16,32.")],
             gpus: Annotated[int, typer.Option(min=1, help="GPUs of the node.")] = 1,
             acceptance_length: Annotated[float, typer.Option(
                 help="The drafter's mean accepted tokens a DFlash round at the block size, "
                      "bonus included (3.5-4.1 on the reference node's block-8 drafter).")]
             = 3.8,
             drafter_layers: Annotated[int, typer.Option(min=1)] = 5,
             engine: Annotated[EstimateEngine, typer.Option(
                 help="The serving engine whose measured kernels and constants price the "
                      "step.")] = EstimateEngine.sglang,
             engine_version: Annotated[str | None, typer.Option(
                 help="The engine's release (default: the pinned one, as `best` prints its "
                      "flags for). SGLang from 0.5.14 prepares a DFlash round while the GPU "
                      "runs the previous one; 0.5.11-0.5.13 and DDTree run rounds serially.",
                 show_default=False)] = None,
             measured_kernels: Annotated[bool | None, typer.Option(
                 help="Price GEMMs, experts, attention and collectives from the GPU's measured "
                      "kernel tables (AIConfigurator's silicon data) instead of the fitted "
                      "roofline (default: wherever the GPU has them).",
                 show_default=False)] = None,
             fmt: Annotated[TableOrJson, typer.Option("--format")] = TableOrJson.table,
             *, launch: dict) -> None:
    """What the performance model predicts for one configuration, without a study or a GPU.
    The launch takes the tuning names (`--speculative-ddtree-budget`, ...), as tuner.yaml and
    the search spaces do."""
    import json

    from tuner.estimate import EstimateRequest, as_json, estimate as run_estimate
    from tuner.estimate import plain_estimate, show

    levels = tuple(sorted({_level(c) for c in concurrency.split(",") if c.strip()}))
    req = EstimateRequest(gpu, gpus, model, acceptance_length, drafter_layers, input_len,
                          output_len, levels, launch, engine.value, measured_kernels,
                          engine_version)
    rows, plain = run_estimate(req), plain_estimate(req)
    if fmt is TableOrJson.json:
        show(req, rows, plain)
        render.emit(json.dumps(as_json(req, rows, plain), indent=2))
    else:
        show(req, rows, plain, render.answer)


def _level(text: str) -> int:
    try:
        level = int(text)
    except ValueError:
        raise UsageError(f"--concurrency wants integers separated by commas, got {text!r}") \
            from None
    from backends.contract import MAX_CONCURRENCY

    if not 1 <= level <= MAX_CONCURRENCY:
        raise UsageError(f"--concurrency levels must be in 1..{MAX_CONCURRENCY} (concurrent "
                         f"requests a node can hold), got {level}")
    return level


# The engine's commands live in their own module (they share nothing with the study ones).
app.command()(engine_cli.generate)
app.command()(engine_cli.serve)  # backends.dflash_server.cli.serve
fixtures_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="Checkpoints for the engine: the tiny "
                           "trained pair (tests, benchmarks, in-process) and random pairs.")
app.add_typer(fixtures_app, name="fixtures")
fixtures_app.command("build")(engine_cli.fixtures_build)
fixtures_app.command("random")(engine_cli.fixtures_random)


def main() -> None:
    """Entry point: an error the user can fix is one line and its exit code (an option the
    parser refuses too); anything else is a bug: a short message and exit 1, its traceback
    under --debug."""
    try:
        code = app(standalone_mode=False)  # the parser's errors come here, not to its box
    except typer.Exit as stop:  # Ctrl-C
        sys.exit(stop.exit_code)
    except typer.TyperException as err:  # click's: a usage error, or help with no arguments
        message = err.format_message()
        if "\n" in message:
            err.show()
        else:
            render.error(message)
        sys.exit(err.exit_code)
    except Exception as err:
        if os.environ.get(DEBUG_ENV) == "1":
            raise
        code = user_error_code(err)
        if code is None:
            render.error(f"internal error: {type(err).__name__}: {err}")
            render.error(f"this is a bug in dflash-tune; --debug (or {DEBUG_ENV}=1) shows its "
                         "traceback")
            sys.exit(1)
        for line in str(err).splitlines() or [type(err).__name__]:
            render.error(line)
        sys.exit(code)
    if isinstance(code, int):  # a command's typer.Exit(code); its return value otherwise
        sys.exit(code)
