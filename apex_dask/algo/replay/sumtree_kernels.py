"""The sum/min-tree kernels behind :class:`apex_dask.algo.replay.sumtree.SumMinTree`.

Two backends compute the same values (see the layout and the arithmetic in
:mod:`apex_dask.algo.replay.sumtree`): numba kernels (``_nb_*``, compiled eagerly
with explicit signatures and cached on disk) when numba imports, and a
vectorized numpy fallback (``_np_*``). Both walk all queries one level at a
time.
"""

from __future__ import annotations

import numpy as np

try:
    import numba

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - exercised only where numba is absent
    numba = None
    HAVE_NUMBA = False

__all__ = ["FANOUT", "HAVE_NUMBA"]

FANOUT = 8
"""Children per node: 8 float64 fill one 64-byte cache line."""

assert FANOUT == 8, "the sampling step below is written for 8 children"
_KW = {"cache": True, "nogil": True, "error_model": "numpy"}
_TREE = "float64[::1], float64[::1], int64[::1], int64[::1]"  # sum, min, offsets, counts

# --------------------------------------------------------------------------
# numba kernels. Node indices are unsigned (uint64) so that indexing compiles
# without negative-index checks (a third of the sampling time otherwise).
# Where nodes are scattered, each level takes two passes over the queries:
# the first only loads each query's cache line (independent loads that the
# CPU keeps many of in flight), the second computes on lines now in cache.
# --------------------------------------------------------------------------
if HAVE_NUMBA:
    K = FANOUT
    U = np.uint64

    @numba.njit(**_KW, inline="always")
    def _nb_node(sum_t, min_t, child0, dst):  # pragma: no cover - compiled
        s = 0.0
        m = np.inf
        for j in range(K):
            s += sum_t[child0 + U(j)]
            v = min_t[child0 + U(j)]
            m = v if v < m else m
        sum_t[dst] = s
        min_t[dst] = m

    @numba.njit(f"void({_TREE}, int64, int64)", **_KW)
    def _nb_fix(sum_t, min_t, offs, counts, lo, hi):  # pragma: no cover - compiled
        # Recompute the ancestors of the leaves lo..hi (inclusive), level by level.
        for d in range(offs.shape[0] - 2, -1, -1):
            lo //= K
            hi //= K
            for i in range(lo, hi + 1):
                _nb_node(sum_t, min_t, U(offs[d + 1]) + U(K) * U(i), U(offs[d]) + U(i))

    @numba.njit(f"void({_TREE}, int64[::1], float64[::1])", **_KW)
    def _nb_set(sum_t, min_t, offs, counts, slots, masses):  # pragma: no cover
        n = slots.shape[0]
        depth = offs.shape[0] - 1
        leaf0 = U(offs[depth])
        nodes = np.empty(n, np.uint64)
        touched = np.empty(n, np.float64)
        for q in range(n):
            nodes[q] = U(slots[q])
            touched[q] = sum_t[leaf0 + nodes[q]] + min_t[leaf0 + nodes[q]]
        # Leaves in order, so with repeated slots the last write wins.
        for q in range(n):
            sum_t[leaf0 + nodes[q]] = masses[q]
            min_t[leaf0 + nodes[q]] = masses[q]
        # Then the touched ancestors from their children, one level at a time.
        # A level no larger than the batch is recomputed whole (same formula).
        for d in range(depth - 1, -1, -1):
            level, below = U(offs[d]), U(offs[d + 1])
            if counts[d] <= n:
                for i in range(counts[d]):
                    _nb_node(sum_t, min_t, below + U(K) * U(i), level + U(i))
            else:
                for q in range(n):
                    p = nodes[q] // U(K)
                    nodes[q] = p
                    touched[q] = sum_t[level + p] + min_t[level + p]
                for q in range(n):
                    p = nodes[q]
                    _nb_node(sum_t, min_t, below + U(K) * p, level + p)

    @numba.njit(**_KW, inline="always")
    def _nb_child(sum_t, b, x):  # pragma: no cover - compiled
        # Which of the K = 8 children at b..b+7 holds mass offset x: three
        # binary steps on pair sums, without branches. A step goes right when
        # x is past the left part and the right part holds mass (so rounding
        # at the edge never lands on an empty child). Returns (x - mass before
        # the child, child).
        one, two, three = U(1), U(2), U(3)
        left = (sum_t[b] + sum_t[b + one]) + (sum_t[b + two] + sum_t[b + three])
        right = (sum_t[b + U(4)] + sum_t[b + U(5)]) + (sum_t[b + U(6)] + sum_t[b + U(7)])
        go = (x >= left) & (right > 0.0)
        x -= left * go
        off = U(4) * U(go)
        left = sum_t[b + off] + sum_t[b + off + one]
        right = sum_t[b + off + two] + sum_t[b + off + three]
        go = (x >= left) & (right > 0.0)
        x -= left * go
        off += two * U(go)
        left = sum_t[b + off]
        go = (x >= left) & (sum_t[b + off + one] > 0.0)
        x -= left * go
        return x, off + U(go)

    @numba.njit(f"void({_TREE}, float64[::1], float64, int64[::1], float32[::1])", **_KW)
    def _nb_sample(sum_t, min_t, offs, counts, u, beta, out_slots, out_w):  # pragma: no cover
        n = u.shape[0]
        depth = offs.shape[0] - 1
        total = sum_t[0]
        nodes = np.zeros(n, np.uint64)
        touched = np.empty(n, np.float64)
        for q in range(n):
            u[q] *= total
        for d in range(depth):
            level = U(offs[d + 1])
            for q in range(n):
                touched[q] = sum_t[level + U(K) * nodes[q]]
            for q in range(n):
                x, child = _nb_child(sum_t, level + U(K) * nodes[q], u[q])
                u[q] = x
                nodes[q] = U(K) * nodes[q] + child
        leaf0 = U(offs[depth])
        inv_min = 1.0 / min_t[0]
        neg_beta = np.float32(-beta)
        for q in range(n):
            out_slots[q] = nodes[q]
            out_w[q] = np.float32(sum_t[leaf0 + nodes[q]] * inv_min) ** neg_beta


# --------------------------------------------------------------------------
# numpy fallback: the same arithmetic, vectorized over queries / nodes
# --------------------------------------------------------------------------
def _np_nodes(sum_t, min_t, offs, d, nodes) -> None:
    """Recompute ``nodes`` (indices in level ``d``) from their children."""
    children = offs[d + 1] + FANOUT * nodes[:, None] + np.arange(FANOUT)
    s = sum_t[children]
    total = s[:, 0] + 0.0
    for j in range(1, FANOUT):
        total += s[:, j]
    sum_t[offs[d] + nodes] = total
    min_t[offs[d] + nodes] = min_t[children].min(axis=1)


def _np_fix(sum_t, min_t, offs, lo, hi) -> None:
    for d in range(offs.shape[0] - 2, -1, -1):
        lo //= FANOUT
        hi //= FANOUT
        _np_nodes(sum_t, min_t, offs, d, np.arange(lo, hi + 1))


def _np_set(sum_t, min_t, offs, slots, masses) -> None:
    uniq, first_in_reversed = np.unique(slots[::-1], return_index=True)  # last write wins
    depth = offs.shape[0] - 1
    sum_t[offs[depth] + uniq] = masses[::-1][first_in_reversed]
    min_t[offs[depth] + uniq] = masses[::-1][first_in_reversed]
    nodes = uniq
    for d in range(depth - 1, -1, -1):
        nodes = np.unique(nodes // FANOUT)
        _np_nodes(sum_t, min_t, offs, d, nodes)


def _np_sample(sum_t, min_t, offs, u, beta) -> tuple[np.ndarray, np.ndarray]:
    depth = offs.shape[0] - 1
    x = u * sum_t[0]
    nodes = np.zeros(u.shape[0], np.int64)
    rows = np.arange(u.shape[0])
    cols = np.arange(FANOUT)
    for d in range(depth):
        c = sum_t[offs[d + 1] + FANOUT * nodes[:, None] + cols]
        left = (c[:, 0] + c[:, 1]) + (c[:, 2] + c[:, 3])
        right = (c[:, 4] + c[:, 5]) + (c[:, 6] + c[:, 7])
        go = (x >= left) & (right > 0.0)
        x = x - left * go
        off = 4 * go
        left = c[rows, off] + c[rows, off + 1]
        right = c[rows, off + 2] + c[rows, off + 3]
        go = (x >= left) & (right > 0.0)
        x = x - left * go
        off = off + 2 * go
        left = c[rows, off]
        go = (x >= left) & (c[rows, off + 1] > 0.0)
        x = x - left * go
        nodes = FANOUT * nodes + off + go
    with np.errstate(divide="ignore", over="ignore"):  # min mass 0 (eps=0): weight 0
        ratio = sum_t[offs[depth] + nodes] * (1.0 / min_t[0])
        weights = ratio.astype(np.float32) ** np.float32(-beta)
    return nodes, weights
