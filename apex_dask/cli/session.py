"""One ``apex-dask-submit`` run once its input is checked: start, train, stop, save.

::

    session = RunSession(args, cfg, out, reporter, spaces)
    code = session.run()        # prints progress, one line per fault, the summary

Start-up (cluster, driver) can be interrupted at any moment by Ctrl-C or
SIGTERM; training stops when a stop condition is met (time and signals are
checked at least once a second, whatever the iteration length: a partial
iteration then gets its own result line), when a runtime fault ends it, or on
a signal. Whatever ends it, the session halts the actors, records the final
counters, saves the learner's weights (never NaN ones), writes a checkpoint
on a signal (SIGTERM/SIGUSR1: ``preempted``, Ctrl-C: ``interrupted``) when
the run has an output folder, and releases everything; one stderr line names
the cause, the exit code says it. After a signal all of it fits in the
stop's grace (:mod:`apex_dask.cli.stopclock`); a checkpoint that could keep
only part of the replay in it says so in one line.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

from apex_dask.cli.checks import EnvSpaces
from apex_dask.cli.clusterflags import close_cluster, is_embedded, tunnel_hint
from apex_dask.cli.exitcodes import (
    EXIT_FAULT,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PREEMPTED,
    EXIT_TERMINATED,
    classify,
)
from apex_dask.cli.outdir import LOG_NAME, ResultsLog, save_weights, write_json, write_text
from apex_dask.cli.output import format_summary, merge_final
from apex_dask.cli.resume import ResumePoint
from apex_dask.cli.signals import StopSignals
from apex_dask.cli.stopclock import StopClock
from apex_dask.cli.watch import (
    REAP_GRACE_S,
    PlacementWatcher,
    child_pids,
    drop_empty,
    log_traceback,
    quiet_teardown_logs,
    reap_children,
    route_logs,
)
from apex_dask.config import ApexConfig
from apex_dask.runtime.errors import describe

__all__ = ["RunSession"]

PREFIX = "apex-dask-submit:"


def _note(line: str) -> None:
    print(f"{PREFIX} note: {line}", flush=True)


def _weights_in(checkpoint: Path | None) -> tuple[int, dict[str, Any]] | None:
    """``(version, {name: array})`` of the online net in ``checkpoint``'s learner part
    (checksum verified), or None."""
    if checkpoint is None:
        return None
    from apex_dask.experiment.checkpoints.store import read_manifest, read_part

    try:
        tree = read_part(checkpoint, read_manifest(checkpoint)["parts"]["learner"])
        return int(tree["counters"]["version"]), dict(tree["online"])
    except Exception:  # noqa: BLE001 - the live learner is asked instead
        return None


class RunSession:
    """Start, train, stop and save one run (see the module docstring)."""

    def __init__(
        self,
        args: argparse.Namespace,
        cfg: ApexConfig,
        out: Path | None,
        reporter: Any,
        spaces: EnvSpaces,
        resume: ResumePoint | None = None,
    ) -> None:
        self.args, self.cfg, self.out, self.reporter, self.spaces = args, cfg, out, reporter, spaces
        self.resume = resume
        self.log_file = None if out is None else out / LOG_NAME
        self.embedded = is_embedded(args)
        self.client: Any = None
        self.cluster: Any = None
        self.driver: Any = None
        self.log: ResultsLog | None = None
        self.results: list[dict[str, Any]] = []
        self.reason = "finished"
        self.partial = False
        self.started = False
        self.error: BaseException | None = None
        self.checkpoint: Any = None
        self.signals = StopSignals()
        self.lost_scheduler = False
        self.scheduler_id: str | None = None
        self.best: str | None = None  # the best evaluation and its weights file, one line

    # ------------------------------------------------------------------ run
    def run(self) -> int:
        self._children_before = child_pids()  # not this run's to end
        self.signals = StopSignals.install(grace_s=self.cfg.checkpoint.grace_s)
        route_logs(self.log_file, debug=self.args.debug)
        try:
            if self.out is not None:
                write_text(self.out / "config.yaml", self.cfg.to_yaml())
                self.log = ResultsLog(self.out / "results.jsonl")
            self._start()
            self.signals.phase = "running"
            self.started = True
            self._train()
        except BaseException as exc:  # noqa: BLE001 - every end is classified below
            self.error = exc
            self.lost_scheduler = self._scheduler_lost()
        finally:
            self.signals.phase = "saving"
            self._teardown()
            self.signals.restore()
        return self._finish()

    def _start(self) -> None:
        self.client, self.cluster = self._connect()
        self.address = getattr(self.client.scheduler, "address", "?")
        self.scheduler_id = (self.client.scheduler_info(n_workers=0) or {}).get("id")
        if not self.embedded:  # the learner's device and replay memory, on its worker
            from apex_dask.cli.remote import check_learner_worker

            bound = max(30.0, self.cfg.topology.call_timeout_s)
            check_learner_worker(self.client, self.cfg, self.spaces, timeout_s=bound)
        from apex_dask.runtime.orchestration.driver import ApexDriver  # torch: after connecting

        # a resume gives the driver the whole folder: it restores the newest checkpoint
        # that verifies, as resolve_resume found it, or an older one if a part's checksum fails
        resume = None if self.resume is None else self.resume.checkpoint.parent
        self.driver = ApexDriver(
            self.cfg,
            client=self.client,
            tensorboard_dir=self.reporter.tensorboard_dir,
            checkpoint_dir=None if self.out is None else self.out / "checkpoints",
            resume_from=resume,
            out_dir=self.out,
        )
        for line in getattr(self.driver, "startup_notes", ()):
            _note(line)
        resumed = getattr(self.driver, "resumed_path", None)
        if resumed is not None and self.out is not None and self.resume is not None:
            self._rewind(resumed, self.driver.resumed_from or {})
        self.reporter.start(self.driver.run_id)
        link = getattr(self.driver, "dashboard_link", None)
        where = f"embedded LocalCluster at {self.address}" if self.embedded else "cluster"
        print(f"{PREFIX} training {self.cfg.env.env_id} on the {where}", flush=True)
        if link:
            print(f"{PREFIX} dashboard {link}", flush=True)
            if hint := tunnel_hint(link, self.cluster, self.embedded):
                print(f"{PREFIX} {hint}", flush=True)
        if not (link or "").rstrip("/").endswith("/apex"):
            print(
                f"{PREFIX} no Ape-X page on this scheduler (metrics still go to "
                "/apex/metrics.json and /metrics); start it with "
                "`dask scheduler --preload apex_dask.runtime.preload` to get /apex",
                flush=True,
            )
        self.watcher = PlacementWatcher(self.driver, self.out)
        learner = self.watcher.placement.get("learner", {})
        if learner and not self.args.quiet:
            print(f"{PREFIX} learner on {learner.get('name') or learner}", flush=True)

    def _rewind(self, checkpoint: Path, meta: dict[str, Any]) -> None:
        """Rows past ``checkpoint`` leave ``results.jsonl`` (:mod:`.rewind`); the resume is
        recorded in ``resumes.jsonl``."""
        from apex_dask.cli.resume import record_resume
        from apex_dask.cli.rewind import rewind_results

        assert self.out is not None and self.resume is not None
        if self.log is not None:
            self.log.close()
        rewound = rewind_results(
            self.out,
            iteration=float(meta.get("iteration", math.inf)),
            timesteps_total=float(meta.get("timesteps_total", math.inf)),
            checkpoint=checkpoint.name,
        )
        self.log = ResultsLog(self.out / "results.jsonl")
        if rewound.line():
            _note(str(rewound.line()))
        record_resume(self.out, checkpoint, self.resume.overrides)
        print(f"{PREFIX} resumed from {checkpoint}", flush=True)
        left = meta.get("left_out")
        if left:  # written inside a stop's grace: each shard goes on with what it kept
            _note(f"{checkpoint.name} was written inside a stop's grace: {left['summary']}")

    def _connect(self) -> tuple[Any, Any]:
        """``(client, cluster)``: the cluster is ours to close (embedded, jobqueue)."""
        from apex_dask.cli.clusterflags import open_cluster

        tls_dir = None if self.out is None else self.out / "tls"  # a jobqueue run's credentials
        return open_cluster(self.args, self.cfg, prefix=PREFIX, tls_dir=tls_dir)

    # ---------------------------------------------------------------- train
    def _train(self) -> None:
        from apex_dask.experiment.stop import StopRule

        rule = StopRule(self.cfg.stop, use_eval=self.cfg.eval.episodes > 0)
        time_s = rule.stop.time_s
        t0 = time.monotonic()
        ended: list[str] = []

        def stop_check() -> bool:
            self.watcher.poll()
            if self.signals.requested:
                ended.append(self.signals.reason())
            elif time_s is not None and time.monotonic() - t0 >= time_s:
                ended.append(f"time_s >= {time_s:g}")
            return bool(ended)

        for result in self.driver.iterate(stop_check=stop_check):
            self._record(result)
            self.watcher.poll()
            why = self.signals.reason() if self.signals.requested else rule.after_result(result)
            if why:
                self.reason = why
                return
        if ended:
            self.reason, self.partial = ended[0], True

    def _record(self, result: dict[str, Any]) -> None:
        self.results.append(result)
        if self.log is not None:
            self.log.append(result)
        self.reporter.update(result)

    # ------------------------------------------------------------- teardown
    def _scheduler_lost(self) -> bool:
        """Whether the scheduler is gone: the client says so, or (after a fault) it does
        not answer within 3 s, or another scheduler answers at its address (restarted:
        the client reconnects, the actors are gone); an actor call may fail first."""
        client = self.client
        if client is None:
            return False
        if getattr(client, "status", "running") not in ("running", "newly-created"):
            return True
        if not self.started or self.error is None or isinstance(self.error, KeyboardInterrupt):
            return False
        try:
            ident = client.sync(client.scheduler.identity, n_workers=0, callback_timeout=3)
        except Exception:
            return True
        return bool(self.scheduler_id) and ident.get("id") != self.scheduler_id

    def _teardown(self) -> None:
        d, clock = self.driver, self.signals.clock  # a clock: a signal stopped the run
        self.lost_scheduler = self.lost_scheduler or self._scheduler_lost()
        if d is not None and self.lost_scheduler:
            _note("the Dask scheduler is gone: nothing more can be fetched")
        elif d is not None:
            self._save(d)
            try:
                d.stop(None if clock is None else clock.exit_s())
            except Exception as exc:
                _note(f"error while releasing actors: {describe(exc)}")
        if self.log is not None:
            self.log.close()
        self.reporter.close(EXIT_OK if self.error is None and not self.signals.requested else 1)
        quiet_teardown_logs()
        if clock is None:
            close_cluster(self.client, self.cluster)
            reap_children(self.log_file, spare=self._children_before)
        else:  # within what is left of the grace
            close_cluster(self.client, self.cluster, timeout_s=clock.exit_s())
            left = max(0.1, clock.left() - 0.5)
            spare = self._children_before
            reap_children(self.log_file, grace_s=min(REAP_GRACE_S, left), spare=spare)

    def _save(self, d: Any) -> None:
        """Halt, record the final counters, save the weights and, after a signal, a
        checkpoint: then the weights are read back from its learner part (the learner
        is not asked twice), and fetched only if there is none."""
        clock, timeout = self.signals.clock, self.cfg.topology.call_timeout_s
        try:  # calls in flight finish: every hop's counters agree
            final = d.halt() if clock is None else d.halt(clock.halt_s(3 * timeout + 10))
        except Exception as exc:
            final = None
            _note(f"could not halt cleanly: {describe(exc)}")
        best = getattr(d, "best", None)
        self.best = None if best is None else best.summary()
        try:
            self._record_final(final)
        except Exception as exc:  # a full disk: what is written stays whole
            _note(str(exc))
        weights = None
        if clock is not None and (self.signals.preempted or self.out is not None):
            self._save_checkpoint(d, clock)
            weights = _weights_in(self.checkpoint)
        if weights is None:
            try:
                weights = d.learner_weights(None if clock is None else clock.weights_s(timeout))
            except Exception as exc:  # the learner may be gone; keep what is saved
                _note(f"could not fetch the final weights: {describe(exc)}")
        if weights is not None and self.out is not None:
            try:
                refused = save_weights(self.out, weights)
            except Exception as exc:
                refused = str(exc)
            if refused:
                _note(refused)

    def _save_checkpoint(self, d: Any, clock: StopClock) -> None:
        reason = "preempted" if self.signals.preempted else "interrupted"
        try:
            self.checkpoint = d.save_checkpoint(reason, within_s=clock.checkpoint_s())
        except Exception as exc:
            _note(f"no checkpoint written: {describe(exc)}")
            return
        self.signals.checkpoint = self.checkpoint
        if left := getattr(d, "checkpoint_left_out", None):
            within = f"keeps what fit in the stop's {clock.grace_s:g} s"
            _note(f"checkpoint {self.checkpoint.name} {within}: {left['summary']}")

    def _record_final(self, final: dict[str, Any] | None) -> None:
        if not final:
            return
        if self.partial and final.get("timesteps_total", 0) > (
            self.results[-1].get("timesteps_total", 0) if self.results else 0
        ):
            record = dict(final)  # the partial iteration: its window, the totals after the halt
            record["iteration"] = float(final.get("iteration", len(self.results))) + 1
            self._record(record)
            if hasattr(self.driver, "count_partial_iteration"):  # checkpoints number after it
                self.driver.count_partial_iteration()
        elif self.results:
            record = self.results[-1] = merge_final(self.results[-1], final)
        else:
            record = final
        if self.out is not None:
            write_json(self.out / "final.json", record)

    # ---------------------------------------------------------------- finish
    def _finish(self) -> int:
        drop_empty(self.log_file)  # a log opened on a full disk and never written
        if self.started:
            print(format_summary(self.results, self._summary_reason(), self.best), flush=True)
        if self.out is not None and self.started:
            names = ("results.jsonl", "final.json", "config.yaml", "weights.npz")
            names += ("weights-best.npz", "placement.json")
            wrote = [n for n in names + self.reporter.outputs if (self.out / n).exists()]
            print(f"{PREFIX} wrote {', '.join(wrote)} to {self.out}", flush=True)
        if self.error is not None:
            if self.args.debug:
                raise self.error
            logged = not isinstance(self.error, KeyboardInterrupt) and log_traceback(
                self.log_file, self.error
            )
            hint = (
                f"traceback in {self.log_file}"
                if logged
                else "rerun with --debug for the traceback"
            )
            code, line = classify(self.error, started=self.started, log_hint=hint)
            if self.started and self.lost_scheduler:
                code = EXIT_FAULT
                line = f"error: lost the Dask scheduler at {self.address}; the run ended"
            print(f"{PREFIX} {line}", file=sys.stderr, flush=True)
            return code
        if self.signals.requested == "SIGINT":
            print(f"{PREFIX} interrupted (Ctrl-C); saved what existed", file=sys.stderr)
            return EXIT_INTERRUPTED
        if self.signals.preempted:
            if self.checkpoint is not None:
                print(
                    f"{PREFIX} preempted ({self.signals.requested}); checkpoint {self.checkpoint}",
                    file=sys.stderr,
                )
                return EXIT_PREEMPTED
            print(
                f"{PREFIX} terminated ({self.signals.requested}); no checkpoint, "
                "the weights were saved if the learner answered",
                file=sys.stderr,
            )
            return EXIT_TERMINATED
        return EXIT_OK

    def _summary_reason(self) -> str:
        if self.error is not None and self.lost_scheduler:
            return f"lost the Dask scheduler at {self.address}"
        if self.error is not None:
            return f"{type(self.error).__name__}: {' '.join(str(self.error).split())[:80]}"
        return self.reason + (" (mid-iteration)" if self.partial else "")
