"""docs/config.md is generated from the config dataclasses and must match them."""

import dataclasses

from trinity_like.config import Config, schema
from trinity_like.config_docs import DOCS_PATH, REGENERATE, missing_docstrings, render, sections


def test_every_config_field_has_a_docstring():
    assert missing_docstrings() == [], "describe these config fields with a docstring under the field"


def test_docs_config_md_is_up_to_date():
    committed = DOCS_PATH.read_text() if DOCS_PATH.is_file() else ""
    assert committed == render(), f"docs/config.md is out of date; regenerate it with `{REGENERATE}`"


def _leaf_keys(cls: type, prefix: str = "") -> list[str]:
    out = []
    for f in dataclasses.fields(cls):
        factory = f.default_factory
        if isinstance(factory, type) and dataclasses.is_dataclass(factory):
            out += _leaf_keys(factory, f"{prefix}{f.name}.")
        elif isinstance(f.type, str) and f.type.startswith("list[") and dataclasses.is_dataclass(
                item := getattr(schema, f.type[5:-1], None)):  # eval_tasksets, buffer.ingest: one table per item
            out += _leaf_keys(item, f"{prefix}{f.name}[].")
        else:
            out.append(prefix + f.name)
    return out


def test_reference_lists_every_key_once_with_default_and_allowed_values():
    keys = [k for s in sections() for k in s.keys]
    listed = [k.key for k in keys]
    assert len(listed) == len(set(listed)) and sorted(listed) == sorted(_leaf_keys(Config))
    by_key = {k.key: k for k in keys}
    assert by_key["mode"].default == "async" and by_key["mode"].allowed == "`sync`, `async`, `offline`"
    assert by_key["explorer.sampling.top_p"].allowed == "0.0 to 1.0"
    assert by_key["trainer.total_steps"].allowed == ">= 1"
    assert "`grpo`" in by_key["algorithm.adv_estimator"].allowed  # from the registry, not a copy
    assert by_key["trainer.batch_size"].default == "null"
    text = render()
    assert "| `trainer.lora.target_modules` | `list[str]` | `[q_proj, k_proj, v_proj, o_proj]` |" in text
    assert "## `explorer.eval_tasksets[]`" in text
