"""Preparing a run directory: check what the user gave (model, task set, buffer schema, the run's config)
before writing anything, then save the resolved config, the run's id and the task set; and the eval task sets
(``prepare_eval_tasksets``: here, not in the explorer, because the trainer publishes them too).

The run's task set is ``explorer.taskset.path``, or ``<run_dir>/tasks.parquet``: generated, the concatenation of
``explorer.taskset.files`` (``trinity_like.common.tasks.concat_tasksets``), or a task set read as Trinity-RFT reads
one (a ``path`` that is not a task file of ours, or any ``subset_name``/``format`` key set:
``trinity_like.common.tasks.reads_rows``; read by ``trinity_like.common.datasets`` and ``rows_to_tasks``), written
once and compared with what its source gives at every later prepare (``_taskset_of_files``, ``_taskset_of_rows``): a
run trains on one task set from start to end. Eval task sets read as Trinity reads them are written likewise, as
``<run_dir>/eval-<name>.parquet``."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from trinity_like.buffer.segments import check_schema_versions, list_segments
from trinity_like.common.errors import ConfigError, RunError
from trinity_like.common.fs import atomic_write_text, fsync_path
from trinity_like.common.tasks import reads_rows
from trinity_like.config import Config, EvalTasksetConfig, flatten, load_config, to_yaml
from trinity_like.runtime.checkpoints import latest_checkpoint
from trinity_like.runtime.paths import RunPaths

if TYPE_CHECKING:
    from trinity_like.common.tasks import Task

ROLES = ("all", "explorer", "trainer")
PER_JOB_KEYS = ("explorer.num_engines", "explorer.num_threads", "explorer.engine", "explorer.vllm",
                "explorer.node", "trainer.num_threads", "trainer.node", "synchronizer.timeout_s", "synchronizer.node",
                "serve", "trainer.max_token_len_per_micro_batch", "trainer.micro_batch_size")
"""Settings that may differ between the jobs of one run (resources of one job; the trainer's micro-batching only
sets its memory, never what is computed, and a Trinity-RFT explorer job's file does not name it); every other key
must match the run's ``config.yaml``."""


def config_differences(a: Config, b: Config) -> list[str]:
    """Keys whose values differ between two configs, leaving out the per-job keys."""
    fa, fb = flatten(a), flatten(b)
    keys = list(fa) + [k for k in fb if k not in fa]  # a dict entry may be in one config only
    return [k for k in keys if fa.get(k) != fb.get(k) and not any(k == p or k.startswith(p + ".") for p in PER_JOB_KEYS)]


def explorer_needs_run_dir(cfg: Config) -> str | None:
    """Why an explorer of ``cfg`` must see the trainer's run directory (None: it needs none and takes the run
    from the Synchronizer: ``trinity_like.runtime.run_home``)."""
    if cfg.buffer.transport == "file":
        return "buffer.transport file writes the buffer folder"
    if cfg.synchronizer.method == "checkpoint":
        return "synchronizer.method checkpoint reads weights from the run directory"
    return None


def _ensure_run_id(paths: RunPaths) -> None:
    """Write the run's id once; of two roles preparing at once, the first link wins and both read it."""
    if paths.run_id.exists():
        return
    tmp = paths.run_dir / f".run_id.tmp-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    tmp.write_text(uuid.uuid4().hex + "\n")
    fsync_path(tmp)
    try:
        os.link(tmp, paths.run_id)  # fails if it exists: never replaces another role's id
        fsync_path(paths.run_dir)
    except FileExistsError:
        pass
    finally:
        tmp.unlink()


def _check_same_config(cfg: Config, paths: RunPaths, role: str, resume: bool) -> None:
    """A role joining a run must run its config; ``--role all --resume`` may change it (and saves it)."""
    if not paths.config.is_file():
        atomic_write_text(paths.config, to_yaml(cfg))
        return
    saved = load_config(paths.config)
    diff = config_differences(saved, cfg)
    if not diff:
        return
    if role == "all" and resume:
        print(f"note: resuming with changed settings: {', '.join(diff)}", flush=True)
        atomic_write_text(paths.config, to_yaml(cfg))
        return
    raise RunError(f"the run in '{paths.run_dir}' runs another config (differs in {', '.join(diff[:6])}"
                   f"{' ...' if len(diff) > 6 else ''}); start this {role} with the run's config.yaml, or pick "
                   "another name")


def _run_started(paths: RunPaths) -> bool:
    """Whether the buffer shows that a run started here: rows an explorer wrote, or rows a trainer took.
    Rows imported before the first start (``buffer ingest``, ``serve`` commits) are data prepared for the run,
    not a run, so a run may start on a buffer that holds only those."""
    from trinity_like.buffer.ledger import Ledger, consumer_names

    if any(info.name.split("-", 2)[1] in ("explorer", "redis") for info in list_segments(paths.buffer_dir)):
        return True
    return any(Ledger(paths.buffer_dir, name, create=False).consumed_rows() for name in
               consumer_names(paths.buffer_dir))


def prepare_run_dir(cfg: Config, allow_existing: bool = False, role: str = "all", resume: bool = False) -> RunPaths:
    """Create the run directory, save the resolved config, build the tiny model and the task set if asked.

    ``role='all'`` refuses a directory that already holds a run unless ``resume``; a ``trainer`` refuses one
    with checkpoints unless ``resume``; an ``explorer`` joins whatever is there. A joining role must bring the
    run's config. ``allow_existing`` lets read-only users (``bench``) open any run directory."""
    from trinity_like.common.tasks import TASKSET_GENERATORS, write_taskset

    if role not in (*ROLES, "serve"):
        raise RunError(f"bad role {role!r}; allowed: {', '.join(ROLES)}")
    paths = RunPaths.of(cfg)
    if role == "explorer" and cfg.mode != "offline" and not explorer_needs_run_dir(cfg):
        # its run directory is the trainer's, published to the Synchronizer; this node keeps its own logs
        paths.run_dir.mkdir(parents=True, exist_ok=True)
        return paths
    if resume:
        latest_checkpoint(paths.checkpoint_dir)  # a damaged pointer stops a resume here, in one line
    if not allow_existing and not resume:
        ckpt = latest_checkpoint(paths.checkpoint_dir)
        if role == "all" and (paths.summary.exists() or _run_started(paths) or ckpt):
            raise RunError(f"run directory '{paths.run_dir}' already holds a run; continue it with --resume, pick "
                           "another name (name=...) or delete that folder")
        if role == "trainer" and ckpt is not None:
            raise RunError(f"run directory '{paths.run_dir}' holds trainer checkpoints (latest {ckpt.name}); "
                           "restart the trainer with --resume, or pick another name")
    # Check what the user gave before writing anything: a config.yaml saved by an attempt that then failed would
    # make the corrected retry look like "another config".
    _check_model(cfg)
    of_rows = None
    if cfg.mode != "offline" and reads_rows(cfg.explorer.taskset):
        of_rows = _taskset_of_rows(cfg, paths, compare=not allow_existing)
    elif cfg.mode != "offline" and cfg.explorer.taskset.path:
        _check_taskset(paths.taskset)
    of_files = (_taskset_of_files(cfg, paths, compare=not allow_existing)
                if cfg.mode != "offline" and cfg.explorer.taskset.files else of_rows)
    if cfg.mode == "offline":
        _check_replay_data(cfg)
    _check_ingest_data(cfg)
    read = {paths.taskset: of_rows} if of_rows is not None else {}
    if cfg.mode != "offline":  # eval sets read as Trinity reads them: refused here, in one line, before any write
        read.update({eval_taskset_path(cfg, ev): tasks_of_rows(cfg, ev, f"explorer.eval_tasksets[{i}]")
                     for i, ev in enumerate(cfg.explorer.eval_tasksets) if reads_rows(ev)})
    if role != "serve":
        check_reward_sources(cfg, read)
    if not allow_existing:
        check_schema_versions(paths.buffer_dir)
    paths.run_dir.mkdir(parents=True, exist_ok=True)
    if not allow_existing:
        _check_same_config(cfg, paths, role, resume)
        _ensure_run_id(paths)
        if role in ("all", "trainer"):
            ingest_at_start(cfg, paths)
    if cfg.mode != "offline" and not paths.taskset.is_file():
        ts = cfg.explorer.taskset
        write_taskset(paths.taskset, of_files if of_files is not None
                      else TASKSET_GENERATORS[ts.generate](ts.size, ts.max_operand, cfg.seed))
    if cfg.mode != "offline":
        _check_taskset(paths.taskset)
    return paths


def _check_replay_data(cfg: Config) -> None:
    """Replay sources of SFT/DPO data (not Experience rows) must be there and have columns their format reads
    (``trinity_like.buffer.ingest.row_shape``): refused here, in one line, before Ray starts; the trainer tokenises
    them as it reads them (``replay_table``), where a bad row is refused naming it."""
    from trinity_like.buffer.ingest import RecordError, is_experience_source, row_shape
    from trinity_like.common.datasets import is_hub_id, read_rows

    b = cfg.buffer
    for source in b.replay_sources:
        path = Path(source)
        if not (path.exists() or is_hub_id(source)) or (path.exists() and is_experience_source(path)):
            continue  # a missing source is refused by the replay reader; Experience rows are read as they are
        data = read_rows(source, b.replay_subset_name, b.replay_split, key="buffer.replay_sources")
        try:
            row_shape(b.replay_format, data.columns)
        except RecordError as e:
            raise RunError(f"buffer.replay_sources: {data.origin}: {e}") from None


def _check_ingest_data(cfg: Config) -> None:
    """Each ``buffer.ingest`` source must be readable and have columns its format reads: refused here, in one line,
    before anything is written."""
    from trinity_like.buffer.ingest import RecordError, row_shape
    from trinity_like.common.datasets import DatasetError, read_rows

    for i, src in enumerate(cfg.buffer.ingest):
        key = f"buffer.ingest[{i}]"
        try:
            data = read_rows(src.path, src.subset_name, src.split, key=f"{key}.path")
        except DatasetError as e:
            raise RunError(str(e)) from None
        try:
            shape, fmt = row_shape(src.format, data.columns)
        except RecordError as e:
            raise RunError(f"{key}: {data.origin}: {e}") from None
        needed = {"messages": [("messages_key", fmt.messages_key)],
                  "plaintext": [("prompt_key", fmt.prompt_key), ("response_key", fmt.response_key)],
                  "pair": [("chosen_key", fmt.chosen_key), ("rejected_key", fmt.rejected_key)]}[shape]
        missing = [(k, c) for k, c in needed if c not in data.columns]
        if missing:
            k, c = missing[0]
            raise RunError(f"{key}: {data.origin} has no column '{c}' ({key}.format.{k}; its columns: "
                           f"{', '.join(data.columns)}); set {key}.format.{k} to the column that holds it")


def ingest_at_start(cfg: Config, paths: RunPaths, say=None) -> list[int]:
    """Write each ``buffer.ingest`` source into the run's buffer as its ``source`` (tokenised with the model's chat
    template as ``replay_sources`` of SFT/DPO data are: ``replay_table``), leaving out rows the buffer holds
    already (their eids come from their content), and say so in one line each; the number written per source."""
    import sys

    import pyarrow as pa

    from trinity_like.buffer.ingest import replay_table
    from trinity_like.buffer.segments import stored_eids
    from trinity_like.buffer.writer import BufferWriter
    from trinity_like.common.errors import UserError

    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    written = []
    for i, src in enumerate(cfg.buffer.ingest):
        try:
            table = replay_table(src.path, cfg.model.path, src.format, src.split, src.subset_name)
        except UserError as e:
            raise RunError(f"buffer.ingest[{i}]: {str(e).removeprefix('buffer.replay_sources: ')}") from None
        table = table.set_column(table.schema.get_field_index("source"), "source",
                                 pa.array([src.source] * table.num_rows, pa.string()))
        seen = stored_eids(paths.buffer_dir) if paths.buffer_dir.exists() else set()
        keep = pa.array([eid not in seen for eid in table.column("eid").to_pylist()])
        new = table.filter(keep)
        if new.num_rows:
            BufferWriter(paths.buffer_dir, writer_id=f"ingest-{src.source}").write_table(new)
        say(f"buffer: {new.num_rows} rows of {src.path} written as source '{src.source}' (buffer.ingest[{i}]; "
            f"{table.num_rows - new.num_rows} already there)")
        written.append(new.num_rows)
    return written


def _taskset_of_files(cfg: Config, paths: RunPaths, compare: bool = True) -> list[Task]:
    """The run's task set as ``explorer.taskset.files`` give it (every file checked, in order; a bad one named in
    one line, RunError). With ``compare``, a ``tasks.parquet`` already in the run directory must be what they give
    (the same Parquet table ``write_taskset`` would write: the concatenation is deterministic): otherwise the
    run's task set changed, and the run stops rather than train on another one from here on."""
    from trinity_like.common.tasks import concat_tasksets

    files = cfg.explorer.taskset.files
    try:
        tasks = concat_tasksets(files)
    except (OSError, ValueError) as e:
        raise RunError(f"explorer.taskset.files: {e}") from None
    _check_unchanged(paths.taskset, tasks, f"the {len(files)} files", "explorer.taskset.files no longer give",
                     "restore those files", compare)
    return tasks


def _check_unchanged(saved_path: Path, tasks: list[Task], givers: str, what: str, restore: str,
                     compare: bool = True) -> None:
    """A task file already written in the run directory (``saved_path``; none yet, or not ``compare``: nothing to
    check) must be the table ``write_taskset`` writes of ``tasks``, what its source gives now; else RunError in one
    line saying where they differ (``givers`` names the source, ``what`` the config key that no longer gives it,
    ``restore`` how to give it again) and the ways out. A task that cannot be written (``taskset_table``'s
    ValueError) is a RunError too, compared or not."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from trinity_like.common.tasks import taskset_table

    try:
        table = taskset_table(tasks)
    except ValueError as e:
        raise RunError(f"{what.split()[0]}: {e}") from None
    if not compare or not saved_path.is_file():
        return
    try:
        saved = pq.read_table(saved_path)
    except (OSError, pa.ArrowException):
        saved = None
    if saved is not None and saved.equals(table):
        return
    if saved is None:
        how = "cannot be read as Parquet"
    elif saved.num_rows != table.num_rows or saved.schema != table.schema:
        how = (f"holds {saved.num_rows} tasks ({', '.join(saved.column_names)}), {givers} give "
               f"{table.num_rows} ({', '.join(table.column_names)})")
    else:
        old, new = saved.to_pylist(), table.to_pylist()
        i = next(i for i, (a, b) in enumerate(zip(old, new, strict=True)) if a != b)
        how = f"differs from what {givers} give from row {i} on (task '{old[i]['task_id']}', now '{new[i]['task_id']}')"
    raise RunError(f"the run's task set changed: '{saved_path}' {how}; {what} the tasks this run started with: "
                   f"{restore}, start a new run for the new tasks (another name=...), or delete that "
                   f"{saved_path.name} to continue this run on them")


def _scores_itself(cfg: Config, ts) -> bool:
    """Whether task set ``ts`` (training or eval) is scored other than by the built-in reward's scorers: a reward
    function or workflow of its own (``reward_fn``, ``format.reward_fn_key``/``workflow_key``), or a workflow that
    scores as it decides (not one of ``REWARD_SCORED_WORKFLOWS``). Its tasks may then lack a ground truth, and
    ``check_reward_sources`` leaves it out."""
    return bool(ts.reward_fn or ts.format.reward_fn_key or ts.format.workflow_key
                or (ts.workflow or cfg.explorer.workflow) not in REWARD_SCORED_WORKFLOWS)


PROMPT_READING_WORKFLOWS = ("single_turn", "tool_agent", "guess_number", "simple_workflow", "async_simple_workflow",
                            "math_workflow", "async_math_workflow", "math_boxed_workflow", "async_math_boxed_workflow")
"""Workflows that send the task's prompt (its ``prompt_key`` column): a task set run by any other may lack it."""


def _prompts_itself(cfg: Config, ts) -> bool:
    """Whether task set ``ts``'s workflow builds its own prompt from the row (not one of
    ``PROMPT_READING_WORKFLOWS``; per-row workflows may be either): its rows may lack a prompt column."""
    return not ts.format.workflow_key and (ts.workflow or cfg.explorer.workflow) not in PROMPT_READING_WORKFLOWS


def tasks_of_rows(cfg: Config, ts, key: str) -> list[Task]:
    """The tasks of a task set read as Trinity-RFT reads it (``reads_rows``): ``ts.path`` read as Hugging Face
    ``datasets`` reads it (``subset_name``, ``split``) and its rows made tasks by ``ts.format``
    (``rows_to_tasks``). ``key`` names the set's config key in messages. RunError, one line naming the file, row
    or column and the fix."""
    from trinity_like.common.datasets import DatasetError, read_rows
    from trinity_like.common.tasks import rows_to_tasks

    try:
        data = read_rows(ts.path, ts.subset_name, ts.split, key=f"{key}.path")
    except DatasetError as e:
        raise RunError(str(e)) from None
    try:
        tasks = rows_to_tasks(data.rows, ts.format, ts.split, origin=f"{key} {data.origin}",
                              answer_optional=_scores_itself(cfg, ts), fmt_key=f"{key}.format",
                              prompt_optional=_prompts_itself(cfg, ts))
    except ValueError as e:
        raise RunError(str(e)) from None
    fmt = ts.format
    if fmt.chat_template or fmt.reply_prefix or fmt.enable_thinking is not None:
        _check_rendering(cfg, tasks[0], key)
    return tasks


def _check_rendering(cfg: Config, task: Task, key: str) -> None:
    """A task set's chat template, reply prefix and thinking switch must render its prompts (a template that does
    not parse, or cannot continue a reply prefix, would fail every task): the first task's prompt is rendered with
    the run's tokenizer here, RunError in one line otherwise."""
    from trinity_like.common.chat import ChatFormatError
    from trinity_like.common.tasks import prompt_ids
    from trinity_like.common.tokenizer import hf_tokenizer

    try:
        prompt_ids(task, hf_tokenizer(cfg.model.path))
    except ChatFormatError as e:
        raise RunError(f"{key}.format: the prompt of task '{task.task_id}' cannot be rendered: {e}; fix "
                       f"{key}.format.chat_template or reply_prefix") from None


def _taskset_of_rows(cfg: Config, paths: RunPaths, compare: bool = True) -> list[Task]:
    """The run's task set read as Trinity-RFT reads it (``tasks_of_rows``), checked, with ``compare``, against the
    ``tasks.parquet`` a first prepare wrote of it (as ``_taskset_of_files`` does)."""
    tasks = tasks_of_rows(cfg, cfg.explorer.taskset, "explorer.taskset")
    _check_unchanged(paths.taskset, tasks, f"'{cfg.explorer.taskset.path}'", "explorer.taskset no longer gives",
                     "restore that data or its format", compare)
    return tasks


def eval_taskset_path(cfg: Config, ev: EvalTasksetConfig) -> Path:
    """Where eval task set ``ev`` lives: its ``path`` (a task file of ours), or ``eval-<name>.parquet`` in the run
    directory (generated, or read as Trinity-RFT reads it: ``reads_rows``)."""
    return (Path(ev.path) if ev.path and not reads_rows(ev)
            else RunPaths.of(cfg).run_dir / f"eval-{ev.name}.parquet")


def prepare_eval_tasksets(cfg: Config) -> dict[str, list[Task]]:
    """Load (or generate, seeded apart from the training tasks) every eval task set; one read as Trinity-RFT reads
    it (``reads_rows``: its ``split`` is often ``test``) is written into the run directory the first time and
    compared with what its source gives every later time (RunError when it changed, as for the training set)."""
    from trinity_like.common.tasks import TASKSET_GENERATORS, load_taskset, write_taskset

    out = {}
    for i, ev in enumerate(cfg.explorer.eval_tasksets):
        path = eval_taskset_path(cfg, ev)
        if reads_rows(ev):
            key = f"explorer.eval_tasksets[{i}]"
            tasks = tasks_of_rows(cfg, ev, key)
            _check_unchanged(path, tasks, f"'{ev.path}'", f"{key} no longer gives", "restore that data or its format")
            if not path.is_file():
                path.parent.mkdir(parents=True, exist_ok=True)
                write_taskset(path, tasks)
        elif not path.is_file() and not ev.path:
            write_taskset(path, TASKSET_GENERATORS[ev.generate](ev.size, ev.max_operand, seed=cfg.seed + 7_919 * (i + 1)))
        out[ev.name] = load_taskset(path)
    return out


REWARD_SCORED_WORKFLOWS = ("single_turn", "tool_agent")
"""The built-in workflows whose rewards come from the reward function (``reward.*``). ``guess_number`` scores its
own game, and a workflow of the user's (an import path) scores as it decides, so their task sets are not checked
by ``check_reward_sources``."""


def reward_task_files(cfg: Config, read: dict[Path, list[Task]] | None = None) -> list[tuple[str, Path]]:
    """The task files a run of ``cfg`` scores with its reward function, as ``(config key, path)``: the training
    task set (every one of ``explorer.taskset.files``, whose concatenation the run's ``tasks.parquet`` is) and every
    eval task set, those given by path and those already generated or read (a resumed run), and those whose tasks
    are in ``read`` (read, not written yet). Files not there yet are left out: a generated set is ours
    (``arithmetic``), a missing given one is refused elsewhere. So are the sets scored otherwise (``_scores_itself``:
    their own reward function or workflow)."""
    paths = RunPaths.of(cfg)
    files = cfg.explorer.taskset.files
    ts = cfg.explorer.taskset
    out = [] if _scores_itself(cfg, ts) else (
        [(f"explorer.taskset.files[{i}]", Path(f).absolute()) for i, f in enumerate(files)] if files
        else [("explorer.taskset.path", paths.taskset)])
    out += [(f"explorer.eval_tasksets[{i}].path", eval_taskset_path(cfg, ev))
            for i, ev in enumerate(cfg.explorer.eval_tasksets) if not _scores_itself(cfg, ev)]
    return [(key, path) for key, path in out if path.is_file() or path in (read or {})]


def check_reward_sources(cfg: Config, read: dict[Path, list[Task]] | None = None) -> None:
    """Refuse a run, in one line (ConfigError), whose reward is the built-in one (no ``reward.function_path``, no
    reward model whose score replaces the function's: ``reward.model.combine`` replace) when a task set it scores
    (``reward_task_files``) has a data source the built-in reward has no scorer for
    (``trinity_like.algorithms.rewards.scorer_for``): every sample of it would fail, and the run would stop at its
    first step. The line names the data source, its file, the scorers there are, and the fix
    (``reward.function_path``; verl's ``custom_reward_function.path``). Then every row's ground truth must be one
    its scorer can read (``_check_truths``), else the run stops naming the row, the scorer, the truth and the fix. Nothing to check in mode ``offline`` (no
    explorer) or with a workflow that does not score with the reward function (``REWARD_SCORED_WORKFLOWS``).

    Reads the ``data_source`` column only, the one the workflows score by (``Task.data_source``; empty = ``math``).
    A file that cannot be read is left to the task-set checks, which say why. ``read``: the tasks of task files not
    written yet (a set read as Trinity-RFT reads it, on its first prepare), checked as those files will hold them."""
    rc = cfg.reward
    if (cfg.mode == "offline" or rc.function_path or (rc.model.path and rc.model.combine == "replace")
            or cfg.explorer.workflow not in REWARD_SCORED_WORKFLOWS):
        return
    from trinity_like.algorithms.rewards import known_scorers, missing_scorer, scorer_for
    from trinity_like.common.tasks import data_sources_of

    read = read or {}
    for key, path in reward_task_files(cfg, read):
        try:
            counts = _source_counts(read[path]) if path in read else data_sources_of(path)
        except (OSError, ValueError):  # not Parquet, damaged: _check_taskset / load_taskset refuse it in words
            continue
        missing = [source for source in counts if scorer_for(source) is None]
        if not missing:
            continue
        first, total = missing[0], sum(counts.values())
        also = f"; also without a scorer: {', '.join(repr(m) for m in missing[1:])}" if len(missing) > 1 else ""
        raise ConfigError(
            f"task set '{path}' ({key}): {missing_scorer(first)}, in {counts[first]} of {total} rows{also}; the "
            f"built-in reward scores {', '.join(known_scorers())}; give a reward function for it: "
            "reward.function_path=FILE.py (verl: custom_reward_function.path) with compute_score(data_source, "
            "solution_str, ground_truth, extra_info=None)")
    for key, path in reward_task_files(cfg, read):
        _check_truths(key, path, read.get(path))


def _source_counts(tasks: list[Task]) -> dict[str, int]:
    """``data_sources_of`` of tasks in hand."""
    counts: dict[str, int] = {}
    for t in tasks:
        counts[t.data_source] = counts.get(t.data_source, 0) + 1
    return counts


TRUTH_SHOWN_CHARS = 60
"""How much of an unreadable ground truth the start-up refusal quotes."""


def _check_truths(key: str, path: Path, tasks: list[Task] | None = None) -> None:
    """Refuse (ConfigError, one line) a task file with a ground truth that the built-in scorer of its row's data
    source cannot read (``trinity_like.algorithms.rewards.truth_problem``: e.g. gsm8k's whole solution without its
    ``#### 72`` under ``math``), which would score every sample of that row 0. Names the first such row (index and
    task_id), the scorer, the truth (shortened), how many rows, and the fix. A file that cannot be read is left to
    the task-set checks."""
    from trinity_like.algorithms.rewards import scorer_for, truth_problem
    from trinity_like.common.tasks import load_taskset

    try:
        tasks = load_taskset(path) if tasks is None else tasks
    except (OSError, ValueError):
        return
    bad = [(i, t, why) for i, t in enumerate(tasks) if (why := truth_problem(t.data_source, t.answer)) is not None]
    if not bad:
        return
    i, task, why = bad[0]
    source = task.data_source or "math"
    shown = repr(task.answer)
    shown = shown if len(shown) <= TRUTH_SHOWN_CHARS else shown[:TRUTH_SHOWN_CHARS - 3] + "..."
    raise ConfigError(
        f"task set '{path}' ({key}): row {i} (task_id '{task.task_id}'): the {scorer_for(source).__name__} scorer "
        f"(data source {source!r}) cannot read its ground truth {shown}: {why} (in {len(bad)} of {len(tasks)} rows); "
        "write the final answer in one of those forms, give the rows a data source whose scorer reads them, or a "
        "reward function: reward.function_path=FILE.py")


def _check_model(cfg: Config) -> None:
    """A model folder with a tokenizer that fits it. The tiny model is built only into the folder that
    ``model.build_tiny_at`` names, never at any path that happens to be missing (a mistyped ``model.path``
    must stop the run, not train a random model there)."""
    from trinity_like.common.tiny_model import ensure_tiny_model
    from trinity_like.common.tokenizer import check_tokenizer_fits_model

    if not os.path.isfile(os.path.join(cfg.model.path, "config.json")):
        tiny = cfg.model.build_tiny_at
        if not tiny or os.path.abspath(tiny) != os.path.abspath(cfg.model.path):
            hint = (f" (model.build_tiny_at builds the tiny model only into '{tiny}')" if tiny else "")
            raise RunError(f"model.path '{cfg.model.path}' has no model{hint}; point it at a Hugging Face model "
                           "folder, build one with `trinity-like make-tiny-model DIR`, or set model.build_tiny_at "
                           "to the same folder as model.path")
        print(f"building the tiny model into {cfg.model.path} (model.build_tiny_at) ...", flush=True)
        ensure_tiny_model(cfg.model.path, seed=cfg.seed)
    check_tokenizer_fits_model(cfg.model.path)


def _check_taskset(path) -> None:
    """Fail here, in one line, rather than inside an explorer actor."""
    from trinity_like.common.tasks import load_taskset

    try:
        load_taskset(path)
    except (OSError, ValueError) as e:
        raise RunError(str(e)) from None
