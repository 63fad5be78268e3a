"""Generated and mutated inputs for the CLIs, and the one property every case must hold.

Shared by ``tests/test_fuzz_inputs.py`` (a fixed budget of examples in the suite) and
``benchmarks/fuzz.py`` (a long run). Four targets, each calling a CLI's own
parse-and-validate entry point in this process:

- ``config``: ``apex-dask-submit --config FILE --print-config``;
- ``set``: ``apex-dask-submit --set KEY=VALUE ... --print-config``;
- ``sweep``: ``apex-dask-sweep FILE --check``;
- ``rllib``: ``apex-dask-submit --from-rllib FILE --print-config``.

Documents start from valid ones (a preset's config, a sweep file, RLlib's tuned examples)
and are mutated: values replaced by random ones of any type, keys added, moved, given
twice or dotted, Tune samplers inserted at any depth, and the text itself spliced with
hostile YAML (alias bombs, deep nesting, tags, huge numbers, control characters). The
property (:func:`check`): exit 0, or exit 2 with at most three stderr lines each naming
the CLI's error; never a traceback; at most :data:`LIMIT_S` seconds and
:data:`LIMIT_MB` MB of Python allocations (``tracemalloc``'s peak) per case.
"""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

import yaml
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
LIMIT_S = 2.0
LIMIT_MB = 200.0
TARGETS = ("config", "set", "sweep", "rllib")

# ---------------------------------------------------------------------------
# values and keys
# ---------------------------------------------------------------------------

ODD_TEXT = [
    "1e-3", "nan", "inf", "-inf", ".inf", "-.inf", ".nan", "null", "~", "true", "yes", "off",
    "0x1F", "0o17", "1_000", "2020-01-01", "2020-13-45", "[1, 2", "{a: 1}", "*x", "&x 1",
    "!!binary aGk=", "!!python/name:os.system", "9" * 5000, "-" * 300, "\u202e", "\t", "",
]  # fmt: skip

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(ODD_TEXT),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=10,
)


def _config_keys() -> list[str]:
    from apex_dask.config import ApexConfig

    return list(ApexConfig.field_docs())


CONFIG_KEYS = _config_keys()
JUNK_KEYS = ["env.env_kwargs.x", "env.env_kwargs.a.b", "preset", "nope", "learner", "replay.", ".x"]
keys = st.one_of(st.sampled_from(CONFIG_KEYS), st.sampled_from(JUNK_KEYS), st.text(max_size=10))


def hostile_snippets() -> st.SearchStrategy[str]:
    """YAML text meant to hurt a reader."""

    def bomb(levels: int, width: int) -> str:
        names = "abcdefghijklmnop"[:levels]
        out = [f"{names[0]}_: &{names[0]} [" + ", ".join(["x"] * width) + "]"]
        for prev, name in zip(names, names[1:], strict=False):
            out.append(f"{name}_: &{name} [" + ", ".join([f"*{prev}"] * width) + "]")
        return "\n".join(out)

    return st.one_of(
        st.builds(bomb, st.integers(2, 12), st.integers(2, 12)),
        st.integers(1, 30_000).map(lambda n: "x: " + "[" * n + "]" * n),
        st.integers(1, 3_000).map(
            lambda n: "".join("  " * i + "a:\n" for i in range(n)) + "  " * n + "1"
        ),
        st.just("x: &a [*a]"),
        st.just("seed: 1\nseed: 2"),
        st.just("x: !!python/object/apply:os.system ['true']"),
        st.just("x: !!binary aGVsbG8="),
        st.just("x: !!set {a, b}"),
        st.just("? [a, b]\n: 1"),
        st.just("x: 2020-13-45"),
        st.just("x: " + "9" * 6000),
        st.just("x: \x00\x07"),
        st.just("\ufeffx: 1"),
        st.just("x: 'unterminated"),
        st.just("- 1\n- 2"),
        st.just("x: *undefined"),
        st.just("%YAML 1.1\n---\nx: 1\n---\ny: 2"),
    )


@st.composite
def mutated_text(draw, text: str) -> str:
    """``text`` with hostile YAML spliced in, characters replaced, or left as it is."""
    how = draw(st.sampled_from(["as is", "splice", "replace", "append", "truncate"]))
    if how == "as is" or not text:
        return text
    if how == "append":
        return text + "\n" + draw(hostile_snippets()) + "\n"
    at = draw(st.integers(0, len(text)))
    if how == "truncate":
        return text[:at]
    if how == "splice":
        return text[:at] + "\n" + draw(hostile_snippets()) + "\n" + text[at:]
    junk = draw(st.text(min_size=1, max_size=8))
    return text[:at] + junk + text[at + len(junk) :]


def dump(doc: object) -> str:
    try:
        return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)
    except yaml.YAMLError:  # a value YAML cannot write: as text
        return str(doc)


# ---------------------------------------------------------------------------
# documents
# ---------------------------------------------------------------------------


@st.composite
def config_docs(draw) -> str:
    """A config file: a preset's keys, some replaced, added, given twice or nested."""
    from apex_dask.config import PRESETS

    doc: dict = {"preset": draw(st.sampled_from([*PRESETS, "nope"]))}
    for _ in range(draw(st.integers(0, 6))):
        key, value = draw(keys), draw(values)
        if draw(st.booleans()) and "." in key:
            head, _, rest = key.partition(".")
            section = doc.setdefault(head, {})
            if isinstance(section, dict):
                section[rest] = value
        else:
            doc[key] = value
    return draw(mutated_text(dump(doc)))


DISTRIBUTIONS = ["grid", "choice", "uniform", "loguniform", "int", "normal", "log", "step"]


@st.composite
def distributions(draw) -> object:
    kind = draw(st.sampled_from(DISTRIBUTIONS))
    arg = draw(
        st.one_of(
            st.lists(st.one_of(st.integers(-5, 2**33), st.floats(-1e3, 1e3), values), max_size=4),
            values,
        )
    )
    spec: dict = {kind: arg}
    if draw(st.booleans()):
        spec[draw(st.sampled_from(["log", "step", "x"]))] = draw(
            st.one_of(st.booleans(), st.integers(-2, 3), values)
        )
    return spec if draw(st.integers(0, 9)) else draw(values)


@st.composite
def sweep_docs(draw) -> str:
    """A sweep file: base, space, objective, budget, sampler, pruner, counts."""
    space = {draw(keys): draw(distributions()) for _ in range(draw(st.integers(0, 3)))}
    if draw(st.booleans()):
        space["dqn.lr"] = {"grid": [0.001, 0.002]}
    doc: dict = {"space": space}
    if draw(st.booleans()):
        doc["base"] = {"preset": "cartpole", "set": {draw(keys): draw(values)}}
    for section, fields in (
        ("objective", ["metric", "mode", "use"]),
        ("budget", ["time_s", "env_steps"]),
        ("sampler", ["name", "seed"]),
        ("pruner", ["name", "reports", "startup_trials", "warmup_reports", "reduction_factor"]),
    ):
        if draw(st.booleans()):
            doc[section] = {draw(st.sampled_from(fields)): draw(values)}
    for count in ("trials", "concurrent"):
        if draw(st.booleans()):
            doc[count] = draw(st.one_of(st.integers(-2, 2**40), values))
    return draw(mutated_text(dump(doc)))


def _rllib_examples() -> list[dict]:
    found = sorted((ROOT / "docs" / "examples" / "rllib").rglob("*.yaml"))
    return [yaml.safe_load(p.read_text()) for p in found]


RLLIB_EXAMPLES = _rllib_examples()
TUNE_KINDS = ["grid_search", "choice", "uniform", "quniform", "loguniform", "randint",
              "qrandint", "lograndint", "randn", "sample_from", "eval"]  # fmt: skip


def _rllib_keys() -> list[str]:
    from apex_dask.config.rllib.registry import RULES

    return sorted({k for r in RULES for k in r.keys if not k.endswith("*")})


RLLIB_KEYS = _rllib_keys()


@st.composite
def rllib_docs(draw) -> tuple[str, str]:
    """An RLlib experiment file (``(text, suffix)``): a tuned example mutated."""
    import copy

    doc = copy.deepcopy(draw(st.sampled_from(RLLIB_EXAMPLES)))
    name = next(iter(doc))
    exp = doc[name]
    config = exp.setdefault("config", {})
    for _ in range(draw(st.integers(0, 5))):
        what = draw(st.sampled_from(["value", "sampler", "deep sampler", "key", "level", "env"]))
        key = draw(st.sampled_from(RLLIB_KEYS))
        if what == "value":
            config[key] = draw(values)
        elif what == "sampler":
            config[key] = {draw(st.sampled_from(TUNE_KINDS)): draw(values)}
        elif what == "deep sampler":
            config.setdefault("env_config", {})["a"] = {
                "b": {draw(st.sampled_from(TUNE_KINDS)): draw(st.lists(scalars, max_size=3))}
            }
        elif what == "key":
            exp[draw(st.sampled_from([*RLLIB_KEYS, "num_samples", "stop", "x"]))] = draw(values)
        elif what == "level" and config:
            moved = draw(st.sampled_from(sorted(map(str, config))))
            exp[moved] = config.pop(moved, None)
        else:
            exp["env"] = draw(st.one_of(st.sampled_from(["Pendulum-v1", "CartPole-v0",
                                                         "PongNoFrameskip-v4", "Nope-v0"]),
                                        values))  # fmt: skip
    if draw(st.booleans()):
        text = json.dumps(exp.get("config") if draw(st.booleans()) else doc, default=str)
        return draw(mutated_text(text)), ".json"
    return draw(mutated_text(dump(doc))), ".yaml"


@st.composite
def set_args(draw) -> list[str]:
    """``--set KEY=VALUE`` flags: known and unknown keys, values as text or flow YAML."""
    args = []
    for _ in range(draw(st.integers(1, 4))):
        value = draw(
            st.one_of(
                st.text(max_size=30),
                st.sampled_from(ODD_TEXT),
                values.map(lambda v: dump(v).strip().replace("\n", " ")),
                hostile_snippets().map(lambda s: s.replace("\n", " ")),
            )
        )
        args += ["--set", f"{draw(keys)}={value}"]
    return args


# ---------------------------------------------------------------------------
# the property
# ---------------------------------------------------------------------------


@dataclass
class Case:
    target: str
    argv: list[str]
    code: int
    err: list[str]
    seconds: float
    peak_mb: float

    def problem(self) -> str | None:
        """Why this case breaks the property (None: it holds)."""
        prog = "apex-dask-sweep:" if self.target == "sweep" else "apex-dask-submit:"
        if any("Traceback" in line for line in self.err):
            return "a traceback"
        if self.seconds > LIMIT_S:
            return f"took {self.seconds:.2f} s"
        if self.peak_mb > LIMIT_MB:
            return f"allocated {self.peak_mb:.0f} MB"
        if self.code == 0:
            return None if not self.err else f"exit 0 with stderr {self.err[:2]}"
        if self.code != 2:
            return f"exit {self.code}: {self.err[-1:]}"
        if not 1 <= len(self.err) <= 3:
            return f"{len(self.err)} stderr lines"
        bad = [line for line in self.err if not line.startswith(f"{prog} error: ")]
        if bad:
            return f"a stderr line that is not one error line: {bad[0][:200]!r}"
        return None


def run_case(target: str, doc: object) -> Case:
    """Write ``doc`` where the target reads it and call the CLI's entry point here."""
    from apex_dask.cli.main import main as submit
    from apex_dask.cli.sweep.main import main as sweep

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if target == "set":
            entry, argv = submit, [*doc, "--print-config"]  # type: ignore[misc]
        elif target == "config":
            path = folder / "config.yaml"
            path.write_bytes(str(doc).encode("utf-8", "surrogatepass"))
            entry, argv = submit, ["--config", str(path), "--print-config"]
        elif target == "sweep":
            path = folder / "space.yaml"
            path.write_bytes(str(doc).encode("utf-8", "surrogatepass"))
            entry, argv = sweep, [str(path), "--out", str(folder / "out"), "--check"]
        else:
            text, suffix = doc  # type: ignore[misc]
            path = folder / f"exp{suffix}"
            path.write_bytes(text.encode("utf-8", "surrogatepass"))
            entry, argv = submit, ["--from-rllib", str(path), "--print-config"]
        out, err = io.StringIO(), io.StringIO()
        tracemalloc.start()
        t0 = time.perf_counter()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    code = entry(argv)
                except SystemExit as exc:  # argparse on a flag it cannot parse
                    code = exc.code if isinstance(exc.code, int) else 2
        finally:
            seconds = time.perf_counter() - t0
            peak = tracemalloc.get_traced_memory()[1] / 2**20
            tracemalloc.stop()
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        if code == 2 and lines and lines[0].startswith("usage:"):  # argparse: usage + error
            lines = [ln for ln in lines if not ln.startswith(("usage:", " "))]
        return Case(target, argv, code, lines, seconds, peak)


STRATEGIES = {
    "config": config_docs(),
    "set": set_args(),
    "sweep": sweep_docs(),
    "rllib": rllib_docs(),
}
