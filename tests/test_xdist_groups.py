"""The suite's shared runs and its `ray start` cluster are made once per ``xdist_group`` (tests/conftest.py,
tests/e2e/test_e2e.py): that holds only while pytest-xdist's ``--dist loadgroup`` really sends a group to one
worker. With pytest 9.2 and pytest-xdist 3.8 it silently did not (pyproject.toml pins pytest below 9.2)."""

import pytest


@pytest.mark.xdist_group("grouping_probe")
def test_a_grouped_test_carries_its_group_to_the_scheduler(request):
    if not getattr(request.config.option, "loadgroup", False):  # set on xdist workers by `--dist loadgroup`
        pytest.skip("runs under `pytest -n N --dist loadgroup` (make test)")
    # xdist's worker appends "@<group>" to the id the scheduler groups by; the scheduler saw what the worker sent
    assert request.node.nodeid.endswith("@grouping_probe"), (
        f"xdist_group is not applied ({request.node.nodeid}): the groups split over workers; see pyproject.toml")
