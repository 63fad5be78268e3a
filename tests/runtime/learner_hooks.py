"""A ``before_learn_on_batch`` hook named by import path in tests (``learner_hooks:scale_weights``; not ``hooks``, the name MkDocs gives the docs site's hooks module in the same process)."""

from __future__ import annotations

from typing import Any


def scale_weights(batch: dict[str, Any], shard_id: int) -> dict[str, Any]:
    """Halve the importance weights (runs on the learner's worker)."""
    return {**batch, "weights": batch["weights"] * 0.5}
