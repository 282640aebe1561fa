"""Row validation: what makes a stored row untrainable, named with the offending value."""

import json
from pathlib import Path

import pyarrow as pa

from trinity_like.common.experience import (
    EXPERIENCE_SCHEMA,
    Experience,
    experiences_to_table,
    row_problem,
    table_row_problems,
)
from trinity_like.common.tokenizer import model_vocab_size


def test_a_good_row_has_no_problem():
    exp = Experience([1, 2], [3, 4], action_mask=[True, False], logprobs=[-0.5, -1.0], reward=1.0,
                     token_rewards=[0.0, 1.0])
    assert row_problem(exp, vocab_size=5) is None
    assert row_problem(Experience([0], [4]), vocab_size=5) is None  # 0 and vocab_size - 1 are both valid ids
    assert row_problem(Experience([1], [2], reward=None, logprobs=None)) is None  # unknown is not wrong


def test_each_problem_is_named_with_its_value():
    assert row_problem(Experience([1, -3], [2])) == "prompt_ids holds token id -3 (negative)"
    assert row_problem(Experience([1], [5, 99999, 7]), vocab_size=100) == \
        "response_ids holds token id 99999 (>= the model's vocabulary size 100)"
    assert row_problem(Experience([1], [100]), vocab_size=100) is not None  # the first id past the end
    assert row_problem(Experience([1], [99999])) is None  # no vocabulary known: only negative ids are wrong
    assert row_problem(Experience([1], [])) == "response_ids is empty"
    assert row_problem(Experience([1], [2, 3], logprobs=[-0.1, float("nan")])) == "logprobs holds nan"
    assert row_problem(Experience([1], [2], token_rewards=[float("inf")])) == "token_rewards holds inf"
    assert row_problem(Experience([1], [2], reward=float("-inf"))) == "reward is -inf"


def test_per_token_lengths_are_checked_in_a_stored_table():
    # The Experience constructor refuses these, so build the Arrow rows directly, as a foreign writer might.
    good = experiences_to_table([Experience([1], [2, 3])]).to_pylist()[0]
    rows = [good, {**good, "logprobs": [-0.1]}, {**good, "action_mask": [True, True, True]}, good]
    table = pa.Table.from_pylist(rows, schema=EXPERIENCE_SCHEMA)
    assert table_row_problems(table) == {1: "logprobs has 1 entries for 2 response tokens",
                                         2: "action_mask has 3 entries for 2 response tokens"}


def test_table_check_gives_row_indices_of_a_sliced_table():
    exps = [Experience([1], [2]), Experience([1], [2, 9]), Experience([-1], [2]), Experience([1], [9])]
    table = experiences_to_table(exps * 2).slice(1, 6)  # rows 1..6 of the 8: offsets no longer start at 0
    assert table_row_problems(table, vocab_size=9) == {
        0: "response_ids holds token id 9 (>= the model's vocabulary size 9)",
        1: "prompt_ids holds token id -1 (negative)",
        2: "response_ids holds token id 9 (>= the model's vocabulary size 9)",
        4: "response_ids holds token id 9 (>= the model's vocabulary size 9)",
        5: "prompt_ids holds token id -1 (negative)"}
    assert [row_problem(e, 9) for e in exps * 2][1:7] == [table_row_problems(table, 9).get(i) for i in range(6)]


def test_model_vocab_size_reads_config_json(tmp_path, tiny_model_path):
    vocab = json.loads((Path(tiny_model_path) / "config.json").read_text())["vocab_size"]
    assert model_vocab_size(tiny_model_path) == vocab < 99999  # the e2e poison-row tests rely on the bound
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"vocab_size": 77}}))
    assert model_vocab_size(tmp_path) == 77
    assert model_vocab_size(tmp_path / "missing") is None
