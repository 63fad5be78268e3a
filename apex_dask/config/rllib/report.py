"""What a conversion prints: the table of keys, the apex_dask YAML (the table as its
comments), the sweep file for Tune samplers, and the Markdown table of every rule
(``docs/rllib.md``: ``python -c "from apex_dask.config.rllib.report import markdown_table;
print(markdown_table())"`` prints it).
"""

from __future__ import annotations

from typing import Any

from apex_dask.config.rllib.convert import Conversion, Row, show
from apex_dask.config.rllib.registry import ERAS, RULES
from apex_dask.config.rllib.rules import Ctx, Ignored, Mapped, Refused

__all__ = ["flat_config", "markdown_table", "sweep_file", "table", "with_table"]


def _targets(targets: dict[str, Any]) -> str:
    return ", ".join(f"{k} = {show(v)}" for k, v in targets.items())


def row_line(row: Row) -> str:
    out = row.outcome
    head = f"{row.key} = {show(row.value)} -> "
    if isinstance(out, Mapped):
        if out.sweep:
            swept = "; ".join(f"{k} over {show(v)}" for k, v in out.sweep.items())
            more = f", {_targets(out.targets)}" if out.targets else ""
            return head + f"apex-dask-sweep: {swept}{more} ({out.note})"
        if out.targets:
            return head + _targets(out.targets) + (f" ({out.note})" if out.note else "")
        return head + "no change" + (f": {out.note}" if out.note else "")
    if isinstance(out, Ignored):
        return head + f"ignored: {out.why}"
    assert isinstance(out, Refused)
    if row.lenient:
        if out.fallback is not None:
            return head + _targets(out.fallback.targets) + f" (--rllib-lenient; {out.why})"
        return head + f"left out (--rllib-lenient): {out.why}"
    return head + f"REFUSED: {out.why}"


def table(conv: Conversion) -> list[str]:
    """The printed table: the file's keys, then RLlib's defaults that were applied, then
    those apex_dask does not reproduce."""
    e = conv.experiment
    era = f"keys of the {ERAS[conv.era]} era ({conv.era_why})"
    run = e.run + (f" ({e.run_from})" if e.run_from else "")
    lines = [f"RLlib experiment {e.name!r} in {e.source}: run {run}; {era}"]
    lines += ["  " + row_line(r) for r in conv.rows if not r.default]
    applied = [
        r for r in conv.rows if r.default and isinstance(r.outcome, Mapped) and r.outcome.targets
    ]
    if applied:
        lines.append(f"Keys the file leaves out take RLlib's {e.run} defaults:")
        lines += ["  " + row_line(r) for r in applied]
    if conv.not_reproduced:
        lines.append("RLlib defaults apex_dask does not reproduce (its own values stay):")
        lines += ["  " + line for line in dict.fromkeys(conv.not_reproduced)]
    if conv.space:
        lines.append(
            f"Tune samplers: {conv.trials} trials for apex-dask-sweep over "
            + "; ".join(f"{k}: {show(v)}" for k, v in conv.space.items())
        )
    return lines


def with_table(conv: Conversion, yaml_text: str, what: str) -> str:
    """``yaml_text`` headed by the table as YAML comments."""
    head = [f"# {what}, converted from RLlib by apex-dask-submit --from-rllib --print-config", "#"]
    head += [f"# {line}" for line in table(conv)]
    return "\n".join(head) + "\n\n" + yaml_text


def flat_config(cfg: Any) -> dict[str, Any]:
    """Every key of ``cfg`` as ``dotted.key: value`` (``env.env_kwargs`` whole)."""
    out: dict[str, Any] = {}

    def walk(node: dict[str, Any], prefix: str) -> None:
        for key, value in node.items():
            name = f"{prefix}{key}"
            if isinstance(value, dict) and name != "env.env_kwargs":
                walk(value, name + ".")
            else:
                out[name] = value

    walk(cfg.to_dict(), "")
    return out


def sweep_file(conv: Conversion, base: Any) -> dict[str, Any]:
    """The apex-dask-sweep file for a conversion with Tune samplers (``base``: its config)."""
    metric = "eval/return_mean" if base.eval.episodes > 0 else "env/episode_return_mean"
    return {
        "base": {"set": flat_config(base)},
        "space": dict(conv.space),
        "objective": {"metric": metric, "mode": "max", "use": "best"},
        "trials": conv.trials,
    }


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table() -> str:
    """Every rule as a Markdown table row (``docs/rllib.md``)."""
    lines = [
        "| RLlib key (other eras' spellings) | run | apex_dask | how |",
        "| --- | --- | --- | --- |",
    ]
    for r in RULES:
        keys = ", ".join(f"`{k}`" for k in r.keys)
        run = "both" if len(r.algos) == 2 else r.algos[0]
        how = r.how
        if r.to == "ignored":  # the reason the table prints
            out = r.handle(None, Ctx(r.algos[0], "2020", False, {}, set()))
            if isinstance(out, Ignored):
                how = f"{how}: {out.why}" if how else out.why
        lines.append(f"| {_cell(keys)} | {run} | {_cell(r.to)} | {_cell(how)} |")
    return "\n".join(lines)
