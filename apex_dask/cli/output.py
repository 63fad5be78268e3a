"""What ``apex-dask-submit`` prints and writes, computed from result dicts.

One progress line per iteration, the closing summary and the final dict taken
after the halt. The files under ``--out`` are written by :mod:`.outdir`.
"""

from __future__ import annotations

from typing import Any

PROGRESS_KEYS = [
    ("it", "iteration", "{:>4.0f}"),
    ("t", "time_s", "{:>6.1f}s"),
    ("steps", "timesteps_total", "{:>8.0f}"),
    ("steps/s", "env/steps_per_s", "{:>7.0f}"),
    ("upd/s", "learner/updates_per_s", "{:>6.1f}"),
    ("return", "env/episode_return_mean", "{:>7.1f}"),
    ("eval", "eval/return_mean", "{:>6.1f}"),
    ("queue", "learner/queue_size", "{:>5.1f}"),
    ("busy", "learner/busy_frac", "{:>5.0%}"),
    ("replay", "replay/size", "{:>8.0f}"),
]


def format_progress(result: dict[str, Any]) -> str:
    parts = []
    for label, key, fmt in PROGRESS_KEYS:
        value = result.get(key)
        text = fmt.format(value) if isinstance(value, int | float) else "-"
        parts.append(f"{label} {text.strip()}")
    return " | ".join(parts)


def format_summary(results: list[dict[str, Any]], reason: str, best: str | None = None) -> str:
    """The closing summary; ``best``: the best evaluation and where its weights are."""
    if not results:
        return f"apex-dask-submit: stopped ({reason}) before the first result"
    last = results[-1]
    evals = [r["eval/return_mean"] for r in results if "eval/return_mean" in r]
    rows = [
        ("stopped because", reason),
        ("iterations", f"{last.get('iteration', len(results)):.0f}"),
        ("wall time", f"{last.get('time_s', float('nan')):.1f} s"),
        ("env steps", f"{last.get('timesteps_total', 0):,.0f}"),
        ("transitions trained", f"{last.get('learner/steps_trained', 0):,.0f}"),
        ("episode return (lowest-eps third)", _fmt(last.get("env/episode_return_mean"))),
        (
            "greedy eval return (last / best)",
            f"{_fmt(evals[-1] if evals else None)} / {_fmt(max(evals) if evals else None)}",
        ),
        ("best greedy eval, its weights", best or "-"),
        ("weight syncs", _fmt(last.get("sync/weight_syncs"), "{:,.0f}")),
        ("batches lost", _fmt(last.get("flow/batches_lost"), "{:,.0f}")),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(["", "Summary"] + [f"  {k:<{width}}  {v}" for k, v in rows])


def _fmt(value: Any, fmt: str = "{:.1f}") -> str:
    return fmt.format(value) if isinstance(value, int | float) else "-"


_CUMULATIVE_SUFFIXES = (
    "timesteps_total",
    "steps_sampled",
    "steps_trained",
    "updates",
    "weight_syncs",
    "target_updates",
    "/added",
    "/sampled",
    "/evicted",
    "/size",
    "enqueue_blocked_s",
)


def merge_final(last: dict[str, Any], final: dict[str, Any]) -> dict[str, Any]:
    """The last result with the counters taken after the halt.

    Only cumulative values (hop counters, faults, totals, sizes) are taken
    from ``final``: its windowed values (rates, episode means) cover only the
    moments between the last result and the halt.
    """
    merged = dict(last)
    for key, value in final.items():
        if (
            key not in last
            or key.startswith(("flow/", "faults/"))
            or key.endswith(_CUMULATIVE_SUFFIXES)
        ):
            merged[key] = value
    return merged
