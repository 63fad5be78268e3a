"""What a sweep leaves behind: the table of trials, ``best.yaml``, ``trials.json``, the plots.

::

    rows = trial_rows(study, spec)
    print(format_table(rows, spec))
    write_best(folder, study, spec)   # best.yaml: apex-dask-submit --config best.yaml
    draw_plots(folder, study)         # history.png, importances.png (Optuna's matplotlib plots)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from apex_dask.cli.outdir import write_json, write_text
from apex_dask.cli.sweep.spec import SweepSpec

__all__ = ["draw_plots", "format_table", "trial_rows", "write_best"]


def trial_rows(study: Any, spec: SweepSpec) -> list[dict[str, Any]]:
    """One row per trial that started: number, state, objective, steps, wall time, params."""
    from optuna.trial import TrialState  # extra: sweep

    from apex_dask.cli.sweep.study import outcome_of

    rows = []
    for t in study.get_trials(deepcopy=False):
        if t.state == TrialState.WAITING:
            continue
        a = {**t.user_attrs, **outcome_of(t)}
        state = t.state.name.lower()
        if t.state == TrialState.FAIL and a.get("interrupted"):
            state = "interrupted"
        elif t.state == TrialState.PRUNED:
            state = f"pruned @{int(a.get('pruned_at') or a.get('steps', 0)):,}"
        value = t.value
        if value is None and t.intermediate_values:
            value = t.intermediate_values[max(t.intermediate_values)]
        rows.append(
            {
                "trial": t.number,
                "state": state,
                "objective": None if value is None else float(value),
                "steps": int(a.get("steps", 0)),
                "wall_s": float(a.get("wall_s", 0.0)),
                "params": dict(t.params),
                "folder": a.get("folder", ""),
                "message": a.get("message", ""),
            }
        )
    return rows


def format_table(rows: list[dict[str, Any]], spec: SweepSpec) -> str:
    """The trials as a fixed-width table; the best complete trial marked with ``*``."""
    keys = spec.space.keys
    best = _best_row(rows, spec)
    head = ["trial", *keys, spec.objective.metric, "steps", "state", "wall s"]
    body = []
    for r in rows:
        mark = "*" if best is not None and r["trial"] == best["trial"] else ""
        obj = "-" if r["objective"] is None else f"{r['objective']:.4g}"
        body.append(
            [
                f"{r['trial']}{mark}",
                *(_short(r["params"].get(k, "-")) for k in keys),
                obj,
                f"{r['steps']:,}",
                r["state"],
                f"{r['wall_s']:.0f}",
            ]
        )
    widths = [max(len(str(c)) for c in col) for col in zip(head, *body, strict=True)]
    lines = [
        "  ".join(str(c).rjust(w) for c, w in zip(row, widths, strict=True))
        for row in [head, *body]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _short(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _best_row(rows: list[dict[str, Any]], spec: SweepSpec) -> dict[str, Any] | None:
    done = [r for r in rows if r["state"] == "complete" and r["objective"] is not None]
    if not done:
        return None
    pick = max if spec.objective.mode == "max" else min
    return pick(done, key=lambda r: r["objective"])


def write_best(folder: Path, study: Any, spec: SweepSpec, rows: list[dict[str, Any]]) -> str | None:
    """``best.yaml`` (the best complete trial's config, runnable by ``apex-dask-submit
    --config``) and ``trials.json``; the best trial's line, or None without one."""
    write_json(folder / "trials.json", {"objective": spec.objective.__dict__, "trials": rows})
    best = _best_row(rows, spec)
    if best is None:
        return None
    cfg = spec.trial_config(spec.space.overrides(best["params"]))
    header = (
        f"# apex-dask-sweep: the best trial of {folder} (trial {best['trial']}, "
        f"{spec.objective.metric} {best['objective']:.4g}, {spec.objective.use} value)\n"
        f"# run it: apex-dask-submit --config best.yaml --out DIR\n"
    )
    write_text(folder / "best.yaml", header + cfg.to_yaml())
    line = (
        f"trial {best['trial']} ({best['folder']}): {spec.objective.metric} {best['objective']:.4g}"
    )
    for name in ("weights-best.npz", "weights.npz"):  # the best weights where the run wrote them
        if (folder / best["folder"] / name).is_file():
            return f"{line}, weights {best['folder']}/{name}"
    return line


def draw_plots(folder: Path, study: Any) -> list[str]:
    """``history.png`` and ``importances.png``; one note per plot that could not be drawn."""
    import matplotlib  # extra: sweep

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # extra: sweep
    from optuna.visualization import matplotlib as ovm  # extra: sweep

    notes = []
    for name, draw in (
        ("history.png", ovm.plot_optimization_history),
        ("importances.png", ovm.plot_param_importances),
    ):
        try:
            ax = draw(study)
            fig = ax.figure if hasattr(ax, "figure") else ax.flat[0].figure
            fig.set_size_inches(8, 5)
            fig.tight_layout()
            tmp = folder / f".{name}.tmp.png"
            fig.savefig(tmp, dpi=100)
            tmp.replace(folder / name)
        except Exception as exc:  # too few complete trials, one parameter's value only
            first = " ".join(str(exc).split())[:120] or type(exc).__name__
            notes.append(f"{name} not drawn: {first}")
        finally:
            plt.close("all")
    return notes
