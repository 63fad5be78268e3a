"""Every input has a bound: hostile YAML (an alias bomb, deep nesting, a key twice, huge
numbers) in a config file, a sweep file, an RLlib file or a ``--set`` value ends in one
line and exit 2, fast and small, through the CLIs' own entry points; and sweep files mean
what they say (``log`` on ``uniform``, a key given twice, the sampler's seed)."""

from __future__ import annotations

import time
import tracemalloc

import pytest

from apex_dask.cli.main import main as submit
from apex_dask.cli.sweep.main import main as sweep
from apex_dask.config import ApexConfig

LIMIT_S, LIMIT_MB = 2.0, 50


def bomb(levels: int = 9, width: int = 9) -> list[str]:
    """A "billion laughs" YAML: ``levels`` anchors of ``width`` aliases each."""
    names = "abcdefghijklmnop"[:levels]
    lines = [f"{names[0]}: &{names[0]} [" + ", ".join(['"lol"'] * width) + "]"]
    for prev, name in zip(names, names[1:], strict=False):
        lines.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * width) + "]")
    return lines


def nest(depth: int) -> str:
    return "[" * depth + "]" * depth


def run_cli(entry, argv, capsys):
    """``entry(argv)`` in this process: its exit code and stderr lines, checked to be
    within the time and memory bounds."""
    if entry is sweep:  # should a check let it through: no cluster is started
        argv = [*argv, "--scheduler", "tcp://127.0.0.1:9", "--connect-timeout", "1"]
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        code = entry(argv)
    finally:
        seconds = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert seconds < LIMIT_S and peak < LIMIT_MB, (seconds, peak, err)
    assert not any("Traceback" in line for line in err), err
    return code, err


def one_line(code, err, *needles):
    assert code == 2 and len(err) == 1, (code, err)
    assert len(err[0]) < 400, err
    for needle in needles:
        assert needle in err[0], (needle, err)


def test_an_alias_bomb_is_refused_in_every_file_the_clis_read(tmp_path, capsys):
    doc = "\n".join(bomb())
    config = tmp_path / "config.yaml"
    config.write_text("env:\n  env_kwargs:\n    x: *i\n" + doc.replace("a:", "zz: 0\na:", 1))
    config.write_text(doc + "\nenv:\n  env_kwargs: {x: *i}\n")
    one_line(*run_cli(submit, ["--config", str(config), "--print-config"], capsys), "alias")
    rllib = tmp_path / "rllib.yaml"
    rllib.write_text(doc + "\nx:\n  run: APEX\n  env: CartPole-v1\n  config: {lr: *i}\n")
    one_line(*run_cli(submit, ["--from-rllib", str(rllib), "--print-config"], capsys), "alias")
    for where in ("base: {set: {env.env_kwargs.x: *i}}", "space: {dqn.lr: {choice: [*i]}}"):
        space = tmp_path / "space.yaml"
        extra = "space: {dqn.lr: {grid: [0.001]}}" if where.startswith("base") else ""
        space.write_text(doc + "\n" + where + "\n" + extra + "\n")
        out = tmp_path / "sweep-out"
        one_line(*run_cli(sweep, [str(space), "--out", str(out)], capsys), "alias")
        assert not out.exists()


def test_an_alias_bomb_in_a_set_value_is_refused(capsys):
    value = "{" + ", ".join(line.replace(": &", ": &", 1) for line in bomb()) + "}"
    one_line(
        *run_cli(submit, ["--set", f"env.env_kwargs.x={value}", "--print-config"], capsys),
        "alias",
    )


@pytest.mark.parametrize("depth", [65, 20_000])
def test_deep_nesting_is_one_line_exit_2_not_a_recursion_error(tmp_path, capsys, depth):
    text = nest(depth)
    config = tmp_path / "config.yaml"
    config.write_text(f"env:\n  env_kwargs:\n    x: {text}\n")
    one_line(*run_cli(submit, ["--config", str(config), "--print-config"], capsys), "deeper")
    space = tmp_path / "space.yaml"
    space.write_text(
        f"space: {{dqn.lr: {{grid: [0.001]}}}}\nbase: {{set: {{env.env_kwargs.x: {text}}}}}\n"
    )
    one_line(*run_cli(sweep, [str(space), "--out", str(tmp_path / "o")], capsys), "deeper")
    rllib = tmp_path / "params.json"
    rllib.write_text('{"env": "CartPole-v0", "x": ' + text + "}")
    one_line(*run_cli(submit, ["--from-rllib", str(rllib), "--print-config"], capsys), "deeper")
    one_line(
        *run_cli(submit, ["--set", f"env.env_kwargs.x={text}", "--print-config"], capsys),
        "deeper",
    )


def test_a_document_too_large_is_refused_before_it_is_parsed(tmp_path, capsys):
    MAX_BYTES = 256 * 1024  # noqa: N806 - apex_dask.config.reader.MAX_BYTES
    config = tmp_path / "config.yaml"
    config.write_text("seed: 1\n" + "# padding\n" * (MAX_BYTES // 10 + 1))
    one_line(*run_cli(submit, ["--config", str(config), "--print-config"], capsys), "KiB")


def test_a_set_value_too_long_is_refused(capsys):
    value = "a: " * 100_000  # a string key takes it as it is: bounded all the same
    one_line(*run_cli(submit, ["--set", f"env.env_id={value}", "--print-config"], capsys), "KiB")


def test_a_key_given_twice_is_refused(tmp_path, capsys):
    config = tmp_path / "config.yaml"
    config.write_text("seed: 1\ndqn: {lr: 0.001}\nseed: 2\n")
    one_line(
        *run_cli(submit, ["--config", str(config), "--print-config"], capsys), "'seed'", "twice"
    )
    config.write_text("dqn: {lr: 0.001}\ndqn.lr: 0.002\n")
    one_line(
        *run_cli(submit, ["--config", str(config), "--print-config"], capsys),
        "dqn.lr",
        "twice",
    )
    space = tmp_path / "space.yaml"
    space.write_text("space:\n  dqn.lr: {grid: [0.001, 0.002]}\n  dqn: {lr: {grid: [0.003]}}\n")
    one_line(*run_cli(sweep, [str(space), "--out", str(tmp_path / "o")], capsys), "twice")
    space.write_text("space: {dqn.lr: {grid: [0.001]}}\ntrials: 2\ntrials: 3\n")
    one_line(*run_cli(sweep, [str(space), "--out", str(tmp_path / "o")], capsys), "twice")


def test_huge_and_odd_values_are_one_line(tmp_path, capsys):
    for text in ("seed: " + "9" * 5000, "seed: 2020-13-45", "env: {env_kwargs: &a {x: *a}}"):
        config = tmp_path / "config.yaml"
        config.write_text(text + "\n")
        code, err = run_cli(submit, ["--config", str(config), "--print-config"], capsys)
        one_line(code, err)


def test_anchors_and_aliases_within_the_bound_still_work(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("preset: pendulum\ndpg: {actor_lr: &lr 0.002, critic_lr: *lr}\n")
    cfg = ApexConfig.from_yaml(path)
    assert cfg.agent.actor_lr == cfg.agent.critic_lr == 0.002


def test_json_infinities_are_what_json_names():
    from apex_dask.config.reader import parse_document

    data = parse_document('{"a": -Infinity, "b": Infinity, "c": NaN}', "x", json_text=True)
    assert data["a"] == float("-inf") and data["b"] == float("inf") and data["c"] != data["c"]


def test_values_in_messages_are_cut_without_being_written_whole():
    from apex_dask.config.reader import shown

    big = list(range(10**7))  # 10 million ints: a whole repr would take a second and ~80 MB
    tracemalloc.start()
    t0 = time.perf_counter()
    text = shown(big)
    seconds, peak = time.perf_counter() - t0, tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert text.startswith("[0, 1, 2, ") and text.endswith("...") and len(text) == 80
    assert seconds < 0.05 and peak < 2**20
    assert shown({"a": (1,), "b": None}) == repr({"a": (1,), "b": None})


def test_read_document_names_the_file_and_the_bound(tmp_path):
    from apex_dask.config.reader import InputError, read_document

    path = tmp_path / "x.yaml"
    path.write_text("\n".join(bomb(6, 8)))  # 8^6 = 262,144 values
    with pytest.raises(InputError, match=r"config file .*x.yaml.* more than 100,000 values"):
        read_document(path, "config file")
    path.write_text("\n".join(bomb(5, 8)))  # 8^5 = 32,768: within the bound
    assert len(read_document(path, "config file")["e"]) == 8


def test_log_on_uniform_draws_on_a_log_scale():
    optuna = pytest.importorskip("optuna")
    from apex_dask.cli.sweep.study import suggest
    from apex_dask.config.space import parse_space

    base = ApexConfig.preset("cartpole")
    space = parse_space({"dqn.lr": {"uniform": [1e-5, 0.1], "log": True}}, base)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    draws = [suggest(study.ask(), space)["dqn.lr"] for _ in range(2000)]
    below = sum(d < 1e-3 for d in draws) / len(draws)
    assert 0.45 < below < 0.55, below  # half of a log scale from 1e-5 to 1e-1 is below 1e-3
    with pytest.raises(ValueError, match="log must be true or false, with lo > 0 and no step"):
        parse_space({"dqn.lr": {"uniform": [0.0, 0.1], "log": True}}, base)


@pytest.mark.parametrize("seed", [-1, 2**32, 2**40])
def test_a_sampler_seed_numpy_cannot_take_is_refused_before_anything_is_created(
    tmp_path, capsys, seed
):
    space = tmp_path / "space.yaml"
    space.write_text(f"space: {{dqn.lr: {{grid: [0.001]}}}}\nsampler: {{seed: {seed}}}\n")
    out = tmp_path / "out"
    one_line(*run_cli(sweep, [str(space), "--out", str(out)], capsys), "seed", "2**32")
    assert not out.exists()
