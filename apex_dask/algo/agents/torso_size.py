"""The sizes of the torsos of :mod:`apex_dask.algo.agents.torsos`, by arithmetic (no torch).

The pre-start memory estimate runs before torch is imported; these functions give
each torso's parameter count and activations per sample (the outputs of every layer
with weights: linear, convolution, LayerNorm) exactly as the modules are built
(``tests/test_memory_estimate.py`` compares them with built networks).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "ENCODERS",
    "IMPALA_CHANNELS",
    "conv_size",
    "image_chw",
    "linear_params",
    "mlp_size",
]

ENCODERS = ("auto", "impala")
"""Conv encoders: ``auto`` (Nature CNN, or the MinAtar conv for small frames), ``impala``."""
IMPALA_CHANNELS = (16, 32, 32)
"""Channels of the IMPALA encoder's three stages (times ``impala_scale``)."""


def image_chw(
    shape: Sequence[int], channels_last: bool | None = None
) -> tuple[tuple[int, int, int], bool]:
    """``((C, H, W), channels_last)`` of a frame shape: rank 2 is one channel; for rank 3
    ``channels_last=None`` guesses HWC when the last axis is the smallest."""
    shape = tuple(int(d) for d in shape)
    if len(shape) == 2:
        return (1, *shape), False
    if channels_last is None:
        channels_last = shape[2] <= min(shape[0], shape[1])
    if channels_last:
        return (shape[2], shape[0], shape[1]), True
    return (shape[0], shape[1], shape[2]), False


def linear_params(in_features: int, out_features: int, noisy: bool) -> int:
    """Parameters of a linear layer (a noisy one holds a mean and a scale of each)."""
    return (in_features + 1) * out_features * (2 if noisy else 1)


def mlp_size(
    in_features: int, hiddens: Sequence[int], *, layer_norm: bool, noisy: bool
) -> tuple[int, int, int]:
    """``(parameters, activations, output features)`` of the MLP torso."""
    params = acts = 0
    for width in hiddens:
        params += linear_params(in_features, int(width), noisy)
        acts += int(width)
        if layer_norm:
            params += 2 * int(width)
            acts += int(width)
        in_features = int(width)
    return params, acts, in_features


def _conv(c: int, out: int, k: int, h: int, w: int, stride: int, pad: int) -> tuple[int, int, int]:
    """(params, output height, output width) of a k x k convolution."""
    return out * (c * k * k + 1), (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1


def conv_size(
    chw: tuple[int, int, int], *, encoder: str, layer_norm: bool, impala_scale: int = 1
) -> tuple[int, int, int]:
    """``(parameters, activations, flattened output features)`` of the conv encoder."""
    c, h, w = chw
    params = acts = 0
    if encoder == "impala":
        for out in (k * int(impala_scale) for k in IMPALA_CHANNELS):
            p, h, w = _conv(c, out, 3, h, w, 1, 1)
            params, acts = params + p, acts + out * h * w
            h, w = (h - 1) // 2 + 1, (w - 1) // 2 + 1  # max-pool 3x3/2, padding 1
            p = _conv(out, out, 3, h, w, 1, 1)[0]
            params, acts = params + 4 * p, acts + 4 * out * h * w  # two residual blocks
            if layer_norm:
                params, acts = params + 2 * out, acts + out * h * w
            c = out
        return params, acts, c * h * w
    convs = [(32, 8, 4), (64, 4, 2), (64, 3, 1)] if min(h, w) >= 36 else [(16, 3, 1)]
    for out, k, stride in convs:
        p, h, w = _conv(c, out, k, h, w, stride, 0)
        params, acts, c = params + p, acts + out * h * w, out
        if layer_norm:
            params, acts = params + 2 * out, acts + out * h * w
    return params, acts, c * h * w
