"""The decode budget on its own (tritonstack.media.decode_budget), no server: how a merged
batch is cut into decoder runs, what a refused request is told, the defaults from a
memory share. Its enforcement on a real server: tests/test_hostile.py."""

from __future__ import annotations

import pytest

from tests.test_hostile import png
from tritonstack.media.decode_budget import DEFAULT_MAX_PIXELS, MAX_RUN_PIXELS, BudgetError, DecodeBudget, plan_parts


def test_plan_parts_keeps_each_run_under_the_batch_budget():
    assert plan_parts([16, 16, 16, 16, 30, 5], 40) == [[0, 1], [2, 3], [4, 5]]
    assert plan_parts([50, 1], 40) == [[0], [1]]  # one request above it runs alone
    assert plan_parts([], 40) == []


def test_request_budget_names_the_numbers():
    budget = DecodeBudget(max_pixels=20, max_request_pixels=30, max_batch_pixels=30, release_above_pixels=10)
    image = png(4, 4)  # 16 pixels
    assert budget.request_pixels([image, b"not an image"], "IN") == 16
    with pytest.raises(BudgetError, match=r"2 images declare 32 pixels in total \(4x4, 4x4\).*max_request_pixels 30"):
        budget.request_pixels([image, image], "IN")
    with pytest.raises(BudgetError, match=r"5x5 = 25 pixels, above this model's max_pixels 20"):
        budget.request_pixels([png(5, 5)], "IN")
    assert DecodeBudget(10, 40, 30, 5).problems()  # a request that passes must fit a run


def test_budget_defaults_follow_the_memory_share():
    budget = DecodeBudget.from_parameters({"max_pixels": {"string_value": "1000"}}, share_bytes=1 << 30)
    assert budget.max_pixels == 1000
    assert budget.max_batch_pixels == budget.max_request_pixels == (1 << 29) // 5
    assert not budget.problems()


def test_budget_defaults_cap_one_run_at_two_of_the_largest_images():
    """A large machine's share does not let one decoder run hold more than
    MAX_RUN_PIXELS: the peak of a burst of huge images stays bounded."""
    budget = DecodeBudget.from_parameters({}, share_bytes=64 << 30)
    assert budget.max_batch_pixels == budget.max_request_pixels == MAX_RUN_PIXELS == 2 * DEFAULT_MAX_PIXELS
    assert budget.max_pixels == DEFAULT_MAX_PIXELS and not budget.problems()
