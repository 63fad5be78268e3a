"""Loss targets checked against hand computation with table "networks"."""

import numpy as np
import pytest
import torch
from torch import nn

from apex_dask.algo.agents.dqn.loss import dqn_loss, q_targets, td_errors_numpy
from apex_dask.algo.agents.losses import huber


class TableQ(nn.Module):
    """Q(s, .) = table[s]: a network whose outputs we choose by hand."""

    def __init__(self, table):
        super().__init__()
        self.table = nn.Parameter(torch.tensor(table, dtype=torch.float32))

    def forward(self, obs):
        return self.table[obs.long()]


# states: 0 = s, 1 = s'. online Q(s) = [1, 2], Q(s') = [3, 0.5]; target Q(s') = [10, 20]
ONLINE = [[1.0, 2.0], [3.0, 0.5]]
TARGET = [[0.0, 0.0], [10.0, 20.0]]
# three transitions from s to s'
BATCH = {
    "obs": torch.tensor([0, 0, 0]),
    "action": torch.tensor([1, 1, 0]),
    "reward": torch.tensor([1.0, 1.0, 0.2]),
    "next_obs": torch.tensor([1, 1, 1]),
    "discount": torch.tensor([0.5, 0.0, 0.05]),
}
WEIGHTS = torch.tensor([1.0, 0.5, 2.0])

# double-Q: a* = argmax online(s') = 0, target(s', 0) = 10
#   y = [1 + .5*10, 1 + 0, .2 + .05*10] = [6, 1, .7];  Q(s,a) = [2, 2, 1]
#   td = [-4, 1, .3];  huber = [3.5, .5, .045]
#   loss = (1*3.5 + .5*.5 + 2*.045) / 3 = 3.84 / 3
DOUBLE = dict(td=[4.0, 1.0, 0.3], loss=3.84 / 3)
# max target: max target(s') = 20
#   y = [11, 1, 1.2]; td = [-9, 1, -.2]; huber = [8.5, .5, .02]
#   loss = (8.5 + .25 + .04) / 3 = 8.79 / 3
SINGLE = dict(td=[9.0, 1.0, 0.2], loss=8.79 / 3)


@pytest.mark.parametrize("double_q,expected", [(True, DOUBLE), (False, SINGLE)])
def test_loss_and_td_match_hand_computation(double_q, expected):
    online, target = TableQ(ONLINE), TableQ(TARGET)
    out = dqn_loss(online, target, BATCH, WEIGHTS, double_q=double_q)
    assert out.td_abs.tolist() == pytest.approx(expected["td"], abs=1e-6)
    assert out.loss.item() == pytest.approx(expected["loss"], rel=1e-6)
    assert out.mean_q.item() == pytest.approx((2 + 2 + 1) / 3)


def test_gradient_is_weighted_clipped_td_on_taken_actions_only():
    online, target = TableQ(ONLINE), TableQ(TARGET)
    dqn_loss(online, target, BATCH, WEIGHTS, double_q=True).loss.backward()
    # dL/dQ(s,a_i) = w_i * clip(td_i, -1, 1) / B ; td = [-4, 1, .3]
    grad_s = [2.0 * 0.3 / 3, (1.0 * -1.0 + 0.5 * 1.0) / 3]
    assert online.table.grad[0].tolist() == pytest.approx(grad_s)
    # the bootstrap target carries no gradient
    assert online.table.grad[1].tolist() == [0.0, 0.0]
    assert target.table.grad is None


def test_terminal_transition_ignores_next_state_value():
    y = q_targets(
        torch.tensor([[5.0, 1.0]]),
        torch.tensor([[100.0, -100.0]]),
        torch.tensor([2.0]),
        torch.tensor([0.0]),
    )
    assert y.tolist() == [2.0]


def test_huber_is_quadratic_then_linear():
    x = torch.tensor([-3.0, -1.0, -0.5, 0.0, 0.5, 2.0])
    assert huber(x).tolist() == pytest.approx([2.5, 0.5, 0.125, 0.0, 0.125, 1.5])
    assert huber(torch.tensor([3.0]), delta=2.0).item() == pytest.approx(4.0)


@pytest.mark.parametrize("double_q,expected", [(True, DOUBLE), (False, SINGLE)])
def test_numpy_td_errors_match_hand_computation(double_q, expected):
    q = np.array(ONLINE, np.float32)[[0, 0, 0]]
    q_next_online = np.array(ONLINE, np.float32)[[1, 1, 1]]
    q_next_target = np.array(TARGET, np.float32)[[1, 1, 1]]
    td = td_errors_numpy(
        q,
        q_next_online,
        q_next_target,
        BATCH["action"].numpy(),
        BATCH["reward"].numpy(),
        BATCH["discount"].numpy(),
        double_q=double_q,
    )
    assert td.dtype == np.float32
    assert td.tolist() == pytest.approx(expected["td"], abs=1e-6)


def test_double_q_without_online_values_raises():
    with pytest.raises(ValueError):
        q_targets(None, torch.zeros(1, 2), torch.zeros(1), torch.zeros(1), double_q=True)
