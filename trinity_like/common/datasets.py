"""Local data read as Hugging Face ``datasets.load_dataset(path, name=subset_name, split=split)`` reads it, without the
``datasets`` package (pyarrow only): the rows of a Trinity-RFT task set or SFT/DPO file, each a dict of its columns.

What ``path`` may be, as ``load_dataset`` takes it:

- a data file, read whole (whatever the split: see below): JSON Lines (``.jsonl``, ``.ndjson``), JSON (``.json``: JSON
  Lines, or one list of records; a list of strings is a ``text`` column), Parquet, CSV (``.csv``; ``.tsv`` with tabs),
  Arrow (``.arrow``: the IPC stream ``datasets`` writes, or an IPC file), Feather (``.feather``) and text (``.txt``:
  one ``text`` row per line);
- a folder laid out as Hugging Face data sets are. Its ``README.md`` may declare ``configs`` (each a
  ``config_name`` with ``data_files`` and/or ``data_dir``; ``subset_name`` picks one, else the one marked
  ``default``, or the only one); otherwise the files of each split are found by ``datasets``' own name patterns
  (``datasets/data_files.py``), first that match wins: ``data/<split>-00000-of-00001*.*`` (sharded, any split
  name), then a folder named for the split (``train/``, ``data/test/``, ``valid_x/`` ...), then a file named for it
  (``train.jsonl``, ``data/train-0.parquet``, ``my_test.csv`` ...), else every file is ``train``. The split
  keywords are ``datasets``': train = train, training; validation = validation, valid, dev, val; test = test,
  testing, eval, evaluation. Of the files found, those with the most common data extension are read (a README,
  a script, a ``.gitattributes`` are not data);
- a Hugging Face hub id (``openai/gsm8k``), read from the local hub cache (``$HF_HUB_CACHE``, else
  ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``: ``datasets--openai--gsm8k/snapshots/<revision>/``, the
  revision ``refs/main`` names) as the folder above; nothing is ever downloaded: an id not in the cache is refused
  in one line saying how to fetch it.

``split`` takes ``datasets``' forms: a name, ``train[:100]`` / ``train[10%:]`` (a slice of rows, percentages
rounded to the closest row) and ``train+test`` (concatenated).

Where this departs from ``datasets``: a single file is read whole whatever ``split`` names (``datasets`` calls it
``train`` and refuses other names; Trinity-RFT's eval sets often say ``split: test`` of one file); a
``subset_name`` in a folder without ``configs`` in its README names a sub-folder (``datasets`` knows only
``default`` there, which reads the folder itself here too);
files of one split whose columns differ are read together, a column missing from a file being null in its rows
(``datasets`` refuses such files); JSON rows whose fields change type from row to row keep their values as they
are (``datasets`` stores such a field as JSON text). Values come as JSON values: timestamps and dates as ISO text,
decimals as floats; binary values (images, audio) are refused, naming the column. A JSON file holding one object
that wraps the records (``{"data": [{...}, ...]}``, objects that are not chat messages) is refused: ``datasets`` reads
it as one row (only ``field=`` unpacks it, which Trinity-RFT never passes). Scripts (``.py`` loaders) and the ``datasets`` Arrow cache are not read.

Every failure is a ``DatasetError`` (a ``UserError``: one line naming the path, file, row or column and the fix).
"""

from __future__ import annotations

import datetime
import decimal
import glob
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trinity_like.common.errors import UserError


class DatasetError(UserError):
    """Data that cannot be read as ``datasets`` would read it; the message names what and how to fix it."""


EXTENSION_FORMATS = {".jsonl": "json", ".ndjson": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv",
                     ".tsv": "tsv", ".arrow": "arrow", ".feather": "feather", ".txt": "text"}
"""The data files read, by extension, and the reader of each (``datasets``' packaged builders)."""

SPLIT_KEYWORDS = {"train": ("train", "training"), "validation": ("validation", "valid", "dev", "val"),
                  "test": ("test", "testing", "eval", "evaluation")}
"""``datasets``' split keywords (``data_files.SPLIT_KEYWORDS``), in its order of splits."""

_SEP = "[-._ 0-9]"
"""``datasets``' ``NON_WORDS_CHARS``: what may stand between a split keyword and the rest of a name."""
SHARDED_PATTERN = "data/{split}-[0-9][0-9][0-9][0-9][0-9]-of-[0-9][0-9][0-9][0-9][0-9]*.*"
"""``datasets``' ``SPLIT_PATTERN_SHARDED``: tried first, its ``{split}`` any name."""
DIR_PATTERNS = ("**/{k}/**", "**/{k}" + _SEP + "*/**", "**/*" + _SEP + "{k}/**", "**/*" + _SEP + "{k}" + _SEP + "*/**")
"""``datasets``' ``KEYWORDS_IN_DIR_NAME_BASE_PATTERNS`` (fsspec >= 2023.12)."""
FILE_PATTERNS = ("**/{k}" + _SEP + "*", "**/*" + _SEP + "{k}" + _SEP + "*")
"""``datasets``' ``KEYWORDS_IN_FILENAME_BASE_PATTERNS`` (fsspec >= 2023.12)."""
FILES_TO_IGNORE = ("README.md", "config.json", "dataset_info.json", "dataset_infos.json", "dummy_data.zip",
                   "dataset_dict.json")
"""``datasets``' ``FILES_TO_IGNORE``: never data, whatever pattern they match."""


@dataclass(frozen=True)
class DataRows:
    """What ``read_rows`` read: the rows (dicts of JSON values, every column in every row, the file's order) and
    the files they came from, in order."""

    rows: list[dict[str, Any]]
    files: list[Path]
    columns: list[str]

    @property
    def origin(self) -> str:
        """The file(s) read, for messages."""
        if len(self.files) == 1:
            return f"'{self.files[0]}'"
        return f"'{self.files[0]}' (and {len(self.files) - 1} more file(s))"


def read_rows(path: str | os.PathLike, subset_name: str = "", split: str = "train", key: str = "path") -> DataRows:
    """The rows of ``split`` of the data at ``path`` (module docstring), as ``load_dataset(path, name=subset_name,
    split=split)`` gives them, slices applied. ``key`` names the config key of ``path`` in messages. DatasetError
    (one line) when there is nothing to read there, the split or subset is not there, or a file cannot be read."""
    text = os.fspath(path)
    if not text:
        raise DatasetError(f"{key} is empty; name a data file, a folder of data files or a Hugging Face data set id")
    parts = _split_parts(split, key)
    local = Path(text).expanduser()
    if local.is_file():
        whole = _rows_of([local.absolute()], key)
        if len(parts) > 1:
            raise DatasetError(f"{key} '{text}' is one file, one split: split '{split}' sums several; name one")
        pieces = [(whole, parts[0])]
    else:
        if local.is_dir():
            folder = local.absolute()
        elif is_hub_id(text):
            folder = hub_snapshot(text, key)
        else:
            raise DatasetError(f"{key} '{text}' does not exist: name a data file (jsonl, json, parquet, csv, arrow), a "
                               "folder laid out as Hugging Face data sets are, or a hub id (org/name) in the local "
                               "Hugging Face cache")
        if (folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file():
            raise DatasetError(f"{key} '{folder}' was written by datasets' save_to_disk, which load_dataset (and so "
                               "Trinity-RFT) refuses to read; write it as data files (Dataset.to_json / to_parquet) "
                               "and point there")
        base, splits = data_files(folder, subset_name, key)
        pieces = []
        for part in parts:
            if part[0] not in splits:
                raise DatasetError(f"{key} '{folder}'{_subset_words(subset_name)} has no split '{part[0]}' (it has "
                                   f"{', '.join(splits) or 'none'}); set split to one of them")
            if not splits[part[0]]:
                raise DatasetError(f"{key} '{base}': split '{part[0]}' has no data files")
            pieces.append((_rows_of(splits[part[0]], key), part))
    rows: list[dict[str, Any]] = []
    files: list[Path] = []
    for got, (_, lo, hi) in pieces:
        rows += got.rows[_bound(lo, len(got.rows), 0):_bound(hi, len(got.rows), len(got.rows))]
        files += [f for f in got.files if f not in files]
    columns = list(dict.fromkeys(c for got, _ in pieces for c in got.columns))
    if not rows:
        raise DatasetError(f"{key}: split '{split}' of {DataRows([], files, []).origin} selects no rows")
    return DataRows([{c: r.get(c) for c in columns} for r in rows], files, columns)


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def is_hub_id(text: str) -> bool:
    """Whether ``text`` reads as a hub data set id (``org/name``) rather than a local path."""
    return bool(_HUB_ID.match(text)) and not text.startswith((".", "/", "~")) and ".." not in text


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache: ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub``,
    else ``~/.cache/huggingface/hub`` (``huggingface_hub``'s order)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "huggingface" / "hub"


def hub_snapshot(repo_id: str, key: str = "path") -> Path:
    """The cached snapshot folder of data set ``repo_id``: the revision ``refs/main`` names, else the only (or the
    newest) snapshot. DatasetError saying that nothing is downloaded and how to fetch it when it is not cached."""
    repo = hub_cache_dir() / f"datasets--{repo_id.replace('/', '--')}"
    snapshots = repo / "snapshots"
    ref = repo / "refs" / "main"
    if ref.is_file() and (snapshots / ref.read_text().strip()).is_dir():
        return snapshots / ref.read_text().strip()
    found = sorted((p for p in snapshots.glob("*") if p.is_dir()), key=lambda p: p.stat().st_mtime) \
        if snapshots.is_dir() else []
    if found:
        return found[-1]
    raise DatasetError(
        f"{key} '{repo_id}' is no local file or folder, and as a Hugging Face hub data set it is not in the local "
        f"cache ({hub_cache_dir()}); nothing is downloaded at run time: fetch it once (`huggingface-cli download {repo_id} --repo-type dataset "
        f"--local-dir DIR`) and set {key} (or TRINITY_TASKSET_PATH) to DIR")


def data_files(folder: Path, subset_name: str = "", key: str = "path") -> tuple[Path, dict[str, list[Path]]]:
    """(base folder, split name -> data files) of a folder: from the README's ``configs`` when it declares them,
    else ``datasets``' default patterns; only files with the most common data extension are kept."""
    configs = readme_configs(folder)
    if configs:
        config = _pick_config(folder, configs, subset_name, key)
        base = folder / str(config.get("data_dir") or "")
        given = config.get("data_files")
        splits = _resolve_given(base, given) if given else _default_splits(base)
    else:
        base = folder
        if subset_name and not (subset_name == "default" and not (folder / "default").is_dir()):
            base = folder / subset_name
            if not base.is_dir():
                subs = sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
                raise DatasetError(f"{key} '{folder}' has no subset '{subset_name}': its README declares no configs "
                                   f"and it has no folder of that name (folders: {', '.join(subs) or 'none'}); set "
                                   "subset_name to one of them, or leave it empty")
        splits = _default_splits(base)
    if not any(splits.values()):
        raise DatasetError(f"{key} '{base}' holds no data files ({', '.join(sorted(EXTENSION_FORMATS))})")
    return base, _keep_main_format(base, splits, key)


def readme_configs(folder: Path) -> list[dict[str, Any]]:
    """The ``configs`` a data set's ``README.md`` declares in its YAML header (empty: none, or no README)."""
    readme = folder / "README.md"
    if not readme.is_file():
        return []
    text = readme.read_text(encoding="utf-8", errors="replace")
    m = re.match(r"^---\s*\n(.*?)\n---\s*(\n|$)", text, re.DOTALL)
    if not m:
        return []
    import yaml

    try:
        meta = yaml.safe_load(m.group(1)) or {}
    except yaml.YAMLError as e:
        raise DatasetError(f"'{readme}': its YAML header cannot be read ({str(e).splitlines()[0]}); fix it or "
                           "remove the header") from None
    configs = meta.get("configs") if isinstance(meta, dict) else None
    return [c for c in configs if isinstance(c, dict)] if isinstance(configs, list) else []


def _subset_words(subset_name: str) -> str:
    return f" (subset '{subset_name}')" if subset_name else ""


def _pick_config(folder: Path, configs: list[dict[str, Any]], subset_name: str, key: str) -> dict[str, Any]:
    names = [str(c.get("config_name", "default")) for c in configs]
    if subset_name:
        if subset_name not in names:
            raise DatasetError(f"{key} '{folder}' has no subset '{subset_name}' (its README declares "
                               f"{', '.join(names)}); set subset_name to one of them")
        return configs[names.index(subset_name)]
    defaults = [c for c in configs if c.get("default")]
    if defaults:
        return defaults[0]
    if len(configs) == 1:
        return configs[0]
    if "default" in names:
        return configs[names.index("default")]
    raise DatasetError(f"{key} '{folder}' has {len(configs)} subsets ({', '.join(names)}) and none is the default; "
                       "set subset_name to one of them")


def _resolve_given(base: Path, given: Any) -> dict[str, list[Path]]:
    """A config's ``data_files``: a pattern, a list of patterns (both ``train``), a dict split -> pattern(s), or a list
    of ``{split, path}`` (``datasets.data_files.sanitize_patterns``)."""
    if isinstance(given, dict):
        patterns = {str(k): v if isinstance(v, list) else [v] for k, v in given.items()}
    elif isinstance(given, list) and any(isinstance(g, dict) for g in given):
        patterns = {str(g.get("split", "train")): g["path"] if isinstance(g.get("path"), list) else [g.get("path")]
                    for g in given if isinstance(g, dict)}
    else:
        patterns = {"train": given if isinstance(given, list) else [given]}
    return {split: _glob_all(base, [str(p) for p in pats if p]) for split, pats in patterns.items()}


def _glob(base: Path, pattern: str) -> list[Path]:
    """Files under ``base`` matching ``pattern`` as ``datasets`` resolves it (fsspec >= 2023.12 globs as Python's
    ``glob`` does): sorted, hidden and ``__special__`` parts left out unless the pattern names them, and
    ``FILES_TO_IGNORE`` left out."""
    out = []
    pattern_parts = Path(pattern).parts
    hidden_in_pattern = sum(1 for p in pattern_parts if p.startswith(".") and set(p) != {"."})
    special_in_pattern = sum(1 for p in Path(pattern).parent.parts if p.startswith("__"))
    for hit in sorted(glob.glob(os.path.join(glob.escape(str(base)), pattern), recursive=True)):
        path = Path(hit)
        if not path.is_file() or path.name in FILES_TO_IGNORE:
            continue
        rel = path.relative_to(base)
        if sum(1 for p in rel.parts if p.startswith(".") and set(p) != {"."}) != hidden_in_pattern:
            continue
        if sum(1 for p in rel.parent.parts if p.startswith("__")) != special_in_pattern:
            continue
        out.append(path)
    return out


def _glob_all(base: Path, patterns: list[str]) -> list[Path]:
    out: list[Path] = []
    for pattern in patterns:
        out += [f for f in _glob(base, pattern) if f not in out]
    return out


def _default_splits(base: Path) -> dict[str, list[Path]]:
    """``datasets.data_files.get_data_patterns`` on ``base``: the first family of patterns that finds files."""
    sharded = _glob(base, SHARDED_PATTERN.replace("{split}", "*"))
    if sharded:
        names: list[str] = []
        for f in sharded:
            m = re.match(r"^(.+)-\d{5}-of-\d{5}", f.name)
            if m and m.group(1) not in names:
                names.append(m.group(1))
        ordered = [s for s in SPLIT_KEYWORDS if s in names] + sorted(n for n in names if n not in SPLIT_KEYWORDS)
        return {s: _glob(base, SHARDED_PATTERN.replace("{split}", s)) for s in ordered}
    for family in (DIR_PATTERNS, FILE_PATTERNS):
        found = {}
        for split, keywords in SPLIT_KEYWORDS.items():
            pats = [p.format(k=k) for k in keywords for p in family]
            if any(_glob(base, p) for p in pats):
                found[split] = _glob_all(base, pats)
        if found:
            return found
    return {"train": _glob(base, "**")}


def _keep_main_format(base: Path, splits: dict[str, list[Path]], key: str) -> dict[str, list[Path]]:
    """Only the files of the most common data extension across all splits (``datasets`` infers one builder per
    data set and reads only its files)."""
    counts: dict[str, int] = {}
    for files in splits.values():
        for f in files:
            ext = f.suffix.lower()
            if ext in EXTENSION_FORMATS:
                counts[EXTENSION_FORMATS[ext]] = counts.get(EXTENSION_FORMATS[ext], 0) + 1
    if not counts:
        seen = sorted({f.suffix or f.name for files in splits.values() for f in files})
        raise DatasetError(f"{key} '{base}' holds no data file this reader reads (found {', '.join(seen[:8])}; read: "
                           f"{', '.join(sorted(EXTENSION_FORMATS))})")
    main = max(counts, key=lambda fmt: counts[fmt])
    return {split: [f for f in files if EXTENSION_FORMATS.get(f.suffix.lower()) == main]
            for split, files in splits.items()}


_SLICE = re.compile(r"^([\w.-]+)(?:\[(-?\d+%?)?:(-?\d+%?)?\])?$")


def _split_parts(split: str, key: str) -> list[tuple[str, str | None, str | None]]:
    """``train+test[:10]`` -> ``[("train", None, None), ("test", None, "10")]``; DatasetError for another form."""
    out = []
    for part in (split or "train").split("+"):
        m = _SLICE.match(part.strip())
        if not m:
            raise DatasetError(f"split '{split}' is not a split name, a slice (train[:100], train[10%:]) or a sum "
                               "(train+test) of them")
        out.append((m.group(1), m.group(2), m.group(3)))
    return out


def _bound(text: str | None, n: int, default: int) -> int:
    if text is None:
        return default
    value = math.floor(n * float(text[:-1]) / 100 + 0.5) if text.endswith("%") else int(text)
    if value < 0:
        value += n
    return max(0, min(n, value))


def _rows_of(files: list[Path], key: str) -> DataRows:
    rows: list[dict[str, Any]] = []
    columns: list[str] = []
    for f in files:
        got = read_file_rows(f)
        for r in got:
            for c in r:
                if c not in columns:
                    columns.append(c)
        rows += got
    if not rows:
        raise DatasetError(f"{key}: {DataRows([], files, []).origin} holds no rows")
    return DataRows([{c: r.get(c) for c in columns} for r in rows], files, columns)


def read_file_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of one data file (its format by extension, ``EXTENSION_FORMATS``), values as JSON values."""
    fmt = EXTENSION_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise DatasetError(f"'{path}' is not a data file this reader reads (extensions: "
                           f"{', '.join(sorted(EXTENSION_FORMATS))}); convert it to JSON Lines or Parquet")
    import pyarrow as pa

    try:
        if fmt == "json":
            rows = _json_rows(path)
        elif fmt == "text":
            rows = [{"text": line} for line in path.read_text(encoding="utf-8").splitlines()]
        else:
            rows = _arrow_table(path, fmt).to_pylist()
    except (pa.ArrowException, OSError, UnicodeDecodeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DatasetError(f"'{path}' cannot be read as {fmt} ({first}); check that the file is what its extension "
                           "says") from None
    return [_json_row(path, i, r) for i, r in enumerate(rows)]


def _arrow_table(path: Path, fmt: str):
    import pyarrow as pa

    if fmt == "parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path)
    if fmt in ("csv", "tsv"):
        import pyarrow.csv as pcsv

        return pcsv.read_csv(path, parse_options=pcsv.ParseOptions(delimiter="\t" if fmt == "tsv" else ","))
    if fmt == "feather":
        import pyarrow.feather as feather

        return feather.read_table(path)
    with pa.memory_map(str(path)) as source:  # arrow: the IPC stream datasets writes, else an IPC file
        try:
            return pa.ipc.open_stream(source).read_all()
        except pa.ArrowInvalid:
            source.seek(0)
            return pa.ipc.open_file(source).read_all()


def _json_rows(path: Path) -> list[dict[str, Any]]:
    """A JSON or JSON Lines file's records, as ``datasets``' json builder takes them: a file that starts with ``[``
    is one list (of records; of strings: a ``text`` column), else one record per line. Records are unified as
    Arrow unifies them (a field missing from a record is null there, nested ones too) where pyarrow can read them;
    fields whose type changes from record to record keep their values as they are."""
    import pyarrow as pa
    import pyarrow.json as paj

    data = path.read_bytes()
    stripped = data.lstrip()
    if stripped.startswith(b"["):
        try:
            items = json.loads(data)
        except json.JSONDecodeError as e:
            raise DatasetError(f"'{path}' is not valid JSON ({e}); write one JSON list of records or JSON Lines") from None
        if all(isinstance(x, str) for x in items):
            return [{"text": x} for x in items]
        bad = next((i for i, x in enumerate(items) if not isinstance(x, dict)), None)
        if bad is not None:
            raise DatasetError(f"'{path}': item {bad} of its list is {type(items[bad]).__name__}, not a record (an "
                               "object); write one object per row")
        data = "\n".join(json.dumps(x, ensure_ascii=False) for x in items).encode()
        records = items
    else:
        records = None
        if stripped.startswith(b"{"):
            _refuse_wrapped_records(path, data)
    try:
        table = paj.read_json(pa.BufferReader(data), read_options=paj.ReadOptions(block_size=max(len(data), 1 << 20)))
        return table.to_pylist()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    if records is None:
        records = []
        for n, line in enumerate(data.decode("utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetError(f"'{path}' line {n} is not JSON ({e}); write one JSON object per line") from None
            if not isinstance(value, dict):
                raise DatasetError(f"'{path}' line {n} is {type(value).__name__}, not a record (an object); write "
                                   "one JSON object per line")
            records.append(value)
    columns = list(dict.fromkeys(c for r in records for c in r))
    return [{c: r.get(c) for c in columns} for r in records]


def _refuse_wrapped_records(path: Path, data: bytes) -> None:
    """Refuse a file that is one JSON object wrapping the records (``{"data": [{...}, ...]}``: a list of objects that
    are not chat messages): ``datasets`` reads it as a single row (only ``field=`` unpacks it, which Trinity-RFT never
    passes). A one-record JSON Lines file, a conversation's messages included, passes."""
    try:
        value = json.loads(data)
    except json.JSONDecodeError:
        return  # JSON Lines: several objects
    if not isinstance(value, dict):
        return
    wrapped = [k for k, v in value.items() if isinstance(v, list) and v and all(isinstance(x, dict) for x in v)
               and not any("role" in x for x in v)]
    if wrapped:
        raise DatasetError(f"'{path}' holds one JSON object (keys {', '.join(list(value)[:6])}), which datasets reads "
                           f"as a single row; write its records ('{wrapped[0]}') as a JSON list or as JSON Lines, one "
                           "object per line")


def _json_row(path: Path, i: int, row: dict[str, Any]) -> dict[str, Any]:
    return {str(k): _jsonable(v, path, i, str(k)) for k, v in row.items()}


def _jsonable(value: Any, path: Path, i: int, column: str) -> Any:
    """``value`` as a JSON value (module docstring); DatasetError naming the row and column for binary data."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v, path, i, column) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, path, i, column) for v in value]
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, (bytes, bytearray)):
        raise DatasetError(f"'{path}' row {i}: column '{column}' holds binary data (an image or audio?), which task "
                           "and experience rows do not carry; drop that column from the file")
    raise DatasetError(f"'{path}' row {i}: column '{column}' holds a {type(value).__name__}, not a JSON value; write "
                       "it as text or numbers")
