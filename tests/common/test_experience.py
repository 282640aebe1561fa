from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trinity_like.common.experience import (
    EXPERIENCE_SCHEMA,
    SCHEMA_VERSION,
    SCHEMA_VERSION_KEY,
    Experience,
    experiences_to_table,
    stored_schema_version,
    table_row_problems,
    table_to_experiences,
    upgrade_table,
)

f32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
ids = st.lists(st.integers(0, 2**31 - 1), max_size=6)


@st.composite
def experiences(draw):
    response = draw(ids)
    n = len(response)
    maybe = lambda s: draw(st.one_of(st.none(), s))  # noqa: E731
    model_version = draw(st.integers(-1, 2**40))
    token_versions = None
    if n and model_version < 2**31 - 4 and draw(st.booleans()):  # per-token versions are int32
        offsets = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
        offsets[draw(st.integers(0, n - 1))] = 0  # model_version is the oldest
        token_versions = [model_version + o for o in offsets]
    return Experience(
        prompt_ids=draw(ids),
        response_ids=response,
        group_id=draw(st.text(max_size=5)),
        task_id=draw(st.text(max_size=5)),
        source=draw(st.sampled_from(["explorer", "human", "agent", "import"])),
        action_mask=maybe(st.lists(st.booleans(), min_size=n, max_size=n)),
        logprobs=maybe(st.lists(f32, min_size=n, max_size=n)),
        reward=maybe(f32),
        token_rewards=maybe(st.lists(f32, min_size=n, max_size=n)),
        model_version=model_version,
        token_versions=token_versions,
        engine_id=maybe(st.text(max_size=4)),
        truncated=draw(st.booleans()),
        prompt_text=maybe(st.text(max_size=8)),
        response_text=maybe(st.text(max_size=8)),
        messages=maybe(st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]),
                                                        "content": st.text(max_size=8)}), max_size=3)),
        info=draw(st.dictionaries(st.text(max_size=4), st.integers() | st.text(max_size=4), max_size=3)),
        created_at=draw(st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1),
                                     timezones=st.just(UTC))).replace(microsecond=draw(st.integers(0, 999999))),
    )


@settings(max_examples=60, deadline=None)
@given(st.lists(experiences(), min_size=1, max_size=4))
def test_arrow_round_trip(exps):
    table = experiences_to_table(exps)
    assert table.schema.equals(EXPERIENCE_SCHEMA)
    assert table_to_experiences(table) == exps


@settings(max_examples=60, deadline=None)
@given(experiences())
def test_json_lines_round_trip(exp):
    assert Experience.from_json(exp.to_json()) == exp


def test_float32_storage_rounds_like_numpy():
    e = Experience(prompt_ids=[1], response_ids=[2], reward=0.1, logprobs=[-0.3])
    back = table_to_experiences(experiences_to_table([e]))[0]
    assert back.reward == float(np.float32(0.1))
    assert back.logprobs.tolist() == [float(np.float32(-0.3))]
    assert back.response_ids.dtype == np.int32 and back.logprobs.dtype == np.float32


def test_schema_carries_version_and_nullability():
    assert EXPERIENCE_SCHEMA.metadata[b"trinity_like.schema_version"] == str(SCHEMA_VERSION).encode()
    assert not EXPERIENCE_SCHEMA.field("eid").nullable
    assert EXPERIENCE_SCHEMA.field("logprobs").nullable
    assert EXPERIENCE_SCHEMA.field("created_at").type == pa.timestamp("us", tz="UTC")


def test_bad_experiences_are_refused():
    with pytest.raises(ValueError, match="logprobs has 1 entries but response_ids has 2"):
        Experience(prompt_ids=[1], response_ids=[2, 3], logprobs=[0.0])
    with pytest.raises(ValueError, match="source must be one of"):
        Experience(prompt_ids=[1], response_ids=[2], source="robot")
    with pytest.raises(ValueError, match="unknown Experience field"):
        Experience.from_json_dict({"prompt_ids": [1], "response_ids": [2], "colour": "red"})
    with pytest.raises(ValueError, match="lacks Experience column"):
        table_to_experiences(pa.table({"eid": ["x"]}))
    with pytest.raises(ValueError, match="token_versions has 1 entries but response_ids has 2"):
        Experience(prompt_ids=[1], response_ids=[2, 3], token_versions=[0], model_version=0)
    with pytest.raises(ValueError, match="model_version is 1 but its oldest token version is 0"):
        Experience(prompt_ids=[1], response_ids=[2, 3], token_versions=[0, 1], model_version=1)


def test_token_versions_of_one_version_are_stored_as_null_with_unchanged_bytes():
    at = datetime(2026, 1, 1, tzinfo=UTC)
    plain = Experience(prompt_ids=[1], response_ids=[2, 3], model_version=4, eid="e", created_at=at)
    same = Experience(prompt_ids=[1], response_ids=[2, 3], model_version=4, token_versions=[4, 4], eid="e",
                      created_at=at)
    assert same.token_versions is None
    assert experiences_to_table([same]).equals(experiences_to_table([plain]))
    mixed = Experience(prompt_ids=[1], response_ids=[2, 3], model_version=4, token_versions=[4, 5])
    back = table_to_experiences(experiences_to_table([mixed]))[0]
    assert back.token_versions.tolist() == [4, 5] and back.token_versions.dtype == np.int32


def test_a_v1_table_is_upgraded_with_null_token_versions():
    exps = [Experience(prompt_ids=[1], response_ids=[2, 3], model_version=1)]
    v2 = experiences_to_table(exps)
    v1 = v2.drop_columns(["token_versions"]).replace_schema_metadata({SCHEMA_VERSION_KEY: b"1"})
    up = upgrade_table(v1, "1")
    assert up.schema.equals(EXPERIENCE_SCHEMA) and up.column("token_versions").null_count == 1
    assert stored_schema_version(up.schema) == "1" and stored_schema_version(v2.schema) == "2"
    assert table_to_experiences(up) == exps
    assert upgrade_table(v2, "2") is v2
    with pytest.raises(ValueError, match=r"schema version '3' is not one this build reads \(versions 1-2\)"):
        upgrade_table(v2, "3")


def test_token_versions_of_the_wrong_length_or_oldest_are_row_problems():
    rows = experiences_to_table([Experience(prompt_ids=[1], response_ids=[2, 3], model_version=1)] * 3).to_pylist()
    rows[0]["token_versions"] = [1]
    rows[1]["token_versions"] = [2, 2]
    rows[2]["token_versions"] = [1, 2]
    problems = table_row_problems(pa.Table.from_pylist(rows, schema=EXPERIENCE_SCHEMA))
    assert problems == {0: "token_versions has 1 entries for 2 response tokens",
                        1: "token_versions' oldest version 2 is not model_version 1"}
