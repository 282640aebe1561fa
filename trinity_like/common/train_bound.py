"""The training staleness rule (``synchronizer.train_slack``): which rows the trainer drops and which tokens it
masks from the loss, as pure functions over versions (numpy arrays, torch tensors or plain ints).

Admission stays AReaL's rule at ``synchronizer.max_staleness``: an explorer starts a group only on weights at
most ``max_staleness`` versions behind the trainer. A group admitted at the bound's edge that runs long lands late
(the longest, hardest groups), and dropping it whole biases training toward short responses. So training applies a
looser per-token bound, ``train_slack`` versions further:

- ``bound`` = ``step - max_staleness``, ``step`` the trainer's version before the step (the weights that train it);
  the reader's ``min_version`` is this bound;
- a token is trained when its version is ``>= bound - train_slack`` (or -1: not this run's policy, no staleness);
  older tokens are masked from the loss (weight 0, and out of the loss's normaliser);
- a row is dropped (``buffer/skipped_stale``) only when none of its tokens is trained: when its newest token's
  version is ``< bound - train_slack``;
- ``train_slack`` 0 is the rule before: a row whose oldest token (``model_version``) is older than ``bound`` is
  dropped whole, and a kept row has no token to mask.

A row's versions: ``model_version`` is its oldest token's; ``token_versions`` holds each response token's when a
weight load happened mid-response (versions never decrease along a response), else every token is
``model_version``'s. The explorer (cancelling an in-flight group that can no longer be trained) and the trainer
(buffer reader, loss mask) both decide by these functions.
"""

from __future__ import annotations

from typing import TypeVar

V = TypeVar("V")  # an int, a numpy array or a torch tensor of versions


def token_min_version(bound: int, train_slack: int) -> int:
    """The oldest version a trained token may carry: ``bound - train_slack`` (``bound = step - max_staleness``)."""
    return bound - train_slack


def row_trainable(oldest: V, newest: V, bound: int, train_slack: int) -> V:
    """Whether a row is trained (at least in part) rather than dropped as stale. ``oldest``: its
    ``model_version``; ``newest``: its newest token's version (``model_version`` when it has no
    ``token_versions``); same shape (B,), or ints. A -1 row (not this run's policy) is always trainable.

    ``train_slack`` 0: ``oldest >= bound`` (whole rows only); else ``newest >= bound - train_slack``.
    Example, bound 5 (step 7, max_staleness 2), slack 1: a row of versions 3..4 is trained (its 4s, the 3s
    masked); a row of versions 2..3 is dropped; with slack 0 both are dropped, and a row of 5..6 is trained."""
    if train_slack <= 0:
        return (oldest < 0) | (oldest >= bound)
    return (oldest < 0) | (newest >= token_min_version(bound, train_slack))


def token_trained(versions: V, bound: int, train_slack: int) -> V:
    """Per token (any shape, e.g. (B, R)): whether it stays in the loss: version -1 (not this run's policy) or
    ``>= bound - train_slack``. With ``train_slack`` 0 every token of a row ``row_trainable`` keeps passes."""
    return (versions < 0) | (versions >= token_min_version(bound, train_slack))
