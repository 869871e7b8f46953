"""The Ray engine: the local engine's stages as a Ray Data pipeline, for clusters.

    driver    walk and manifest diff: only new and changed files are sent out
    tasks     chunk and MinHash-sign blocks of files (``map_batches``)
    shuffle   exact groups by content hash, LSH buckets by band key (``groupby``):
              near duplicates on different workers meet in one bucket
    driver    duplicate verdicts replayed over the sparse candidate pairs in path
              order, so they equal the local engine's (``resolve_duplicates``)
    actors    embed and quantize exemplars: one model per actor, its backend
              picked by the selector on the actor's own hardware
    tasks     duplicates take their exemplar's codes
    write     clean build: workers write Lance fragments, the driver commits them
              as one version; incremental build: the driver merges the changed
              rows (``TableWriter``), as the local engine does

Readers see nothing before the driver commits and moves HEAD. Ray retries a
task or restarts an actor that dies; every stage is a pure function of its
input block, so a retried block yields the same rows.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import time
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ssindex.backends.base import EncodeStats
from ssindex.backends.model import ModelSpec
from ssindex.backends.selector import BackendReport
from ssindex.errors import ERRORS, EngineUnavailable, map_exceptions
from ssindex.index.layout import CHUNK_SCHEMA
from ssindex.index.table import TableWriter, table_path
from ssindex.pipeline.engines.common import RunStats, manifest_entry
from ssindex.pipeline.engines.ray_tasks import (
    ACTOR_COLUMNS,
    CHUNK_ROW,
    FILE_BITS,
    FILE_BLOCK,
    PAIRS,
    PARTICIPANT_COLUMNS,
    EmbedActor,
    attach_verdicts,
    chunk_block,
    copy_exemplar_codes,
    dedupe_group,
    dedupe_keys,
    explode_chunks,
    preflight,
    select_rows,
    write_fragments,
)
from ssindex.pipeline.engines.tally import Tallied, Tally
from ssindex.pipeline.plan import BuildPlan, RayOptions
from ssindex.pipeline.previous import PreviousIndex
from ssindex.pipeline.progress import Progress
from ssindex.stages.dedupe import Candidate, resolve_duplicates
from ssindex.stages.signature import rows_per_band
from ssindex.stages.walk import reread, walk

# -- the driver ----------------------------------------------------------------------------

@contextlib.contextmanager
def ray_cluster(options: RayOptions) -> Iterator[Any]:
    """Connect to ``options.address``, or start (and afterwards stop) a local cluster."""
    try:
        import ray
        import ray.data
    except ImportError as exc:
        raise EngineUnavailable(
            "--engine ray needs the ray extra: pip install 'ssindex[ray]'") from exc
    if ray.is_initialized():
        yield ray
        return
    # an unreachable or refusing cluster: ConnectionError, TimeoutError, a bad address
    # ValueError, a failed local start RuntimeError
    with map_exceptions({(OSError, ValueError, RuntimeError): lambda exc: EngineUnavailable(
            f"cannot start or reach a Ray cluster: {exc}")}):
        ray.init(address=options.address, include_dashboard=False, log_to_driver=False,
                 logging_level=logging.ERROR, configure_logging=False,
                 runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1",
                                           "TOKENIZERS_PARALLELISM": "false"}})
    try:
        yield ray
    finally:
        ray.shutdown()


def run_ray(plan: BuildPlan, stats: RunStats, progress: Progress, writer: TableWriter,
            previous: PreviousIndex | None, explicit: str | None, model: ModelSpec,
            options: RayOptions) -> tuple[int, BackendReport, EncodeStats]:
    """Run the build on Ray and commit it; returns the table version, a report of the
    backends the actors chose, and their encode counts."""
    with ray_cluster(options) as ray:
        context = ray.data.DataContext.get_current()
        context.print_on_execution_start = False
        logging.getLogger("ray.data").setLevel(logging.ERROR)
        run = _Run(ray, plan, stats, progress, previous, model, options)
        try:
            return run.execute(writer, explicit)
        finally:
            run.close()


class _Run:
    def __init__(self, ray: Any, plan: BuildPlan, stats: RunStats, progress: Progress,
                 previous: PreviousIndex | None, model: ModelSpec, options: RayOptions) -> None:
        self.ray, self.plan, self.stats, self.progress = ray, plan, stats, progress
        self.previous, self.model, self.options = previous, model, options
        self.cfg = plan.config
        self.encode = EncodeStats()
        self.resources = ray.cluster_resources()

    @functools.cached_property
    def tally(self) -> Any:
        """The ``Tally`` actor the stages report to: started by the first stage that sends
        work out (a rebuild with nothing changed starts none)."""
        return self.ray.remote(num_cpus=0)(Tally).remote()

    def close(self) -> None:
        """Stop the tally, if a stage started one. It would go with the driver anyway, so
        a failure here never hides the build's own error."""
        if "tally" in vars(self):  # a cached_property is stored once read
            with contextlib.suppress(Exception):
                self.ray.kill(self.tally)

    def execute(self, writer: TableWriter, explicit: str | None,
                ) -> tuple[int, BackendReport, EncodeStats]:
        started = time.perf_counter()
        files, stored = self._walk()
        started = self.stats.clock.lap("walk", started)
        rows = self._chunk(files)
        started = self.stats.clock.lap("chunk", started)
        if self.stats.chunk.chunks == 0:  # an empty tree: nothing to shuffle or embed
            return self._write_nothing(writer, started, "no chunks")
        rows, needed = self._dedupe(rows, stored)
        started = self.stats.clock.lap("dedupe", started)
        if rows is None:  # every file unchanged, every verdict kept
            return self._write_nothing(writer, started, "every vector reused")
        embedded, backends = self._embed(rows, explicit)
        started = self.stats.clock.lap("embed", started)
        records = embedded.union(self._copy_duplicates(rows, embedded, needed))
        if self.previous is None or writer.previous is None:  # a first build, or a purge
            version = self._commit_fragments(records, writer)
        else:
            version = writer.write(_record_batches(records), self.previous.digests,
                                   self.stats.row_ids)
        self.stats.clock.lap("write", started)
        actors, cpus, gpus = self._actors()
        report = BackendReport.merged(
            [BackendReport.from_json(json.loads(chosen)) for chosen in sorted(backends)],
            {"embed_actors": actors, "cpus_per_actor": cpus, "gpus_per_actor": gpus})
        return version, report, self.encode

    def _tallied(self, stage: str, limit: int | None = None) -> Tallied:
        return Tallied(self.progress, stage,
                        lambda: int(self.ray.get(self.tally.done.remote(stage))), limit)

    def _write_nothing(self, writer: TableWriter, started: float, reason: str,
                       ) -> tuple[int, BackendReport, EncodeStats]:
        """Commit no new rows (deleting those of removed files) without starting actors."""
        version = writer.write(iter(()), self.previous.digests
                               if self.previous and writer.previous else {}, self.stats.row_ids)
        self.stats.clock.lap("write", started)
        return version, BackendReport.unloaded(reason), self.encode

    def _walk(self) -> tuple[list[pa.Table], list[dict[str, Any]]]:
        """Blocks of changed files to send out; unchanged files' stored rows stay here."""
        block: list[dict[str, Any]] = []
        blocks: list[pa.Table] = []
        previous = self.plan.previous
        positions: list[int] = []
        ordinals: list[int] = []
        for source in walk(self.plan.root, self.cfg.walk, self.stats.walk, self.plan.index_path,
                           previous.known if previous is not None else None):
            self.progress.advance("walk")
            ordinal = len(self.stats.manifest)  # the file's place in the manifest
            if previous is not None and (kept := previous.carried(source)) is not None:
                self.stats.chunk.files_unchanged += 1
                self.stats.manifest.append(manifest_entry(source, kept))
                positions += [previous.position[i] for i in kept]
                ordinals += [ordinal << FILE_BITS | position for position in range(len(kept))]
                continue
            read = reread(self.plan.root, source, self.cfg.walk, self.stats.walk)
            if read is None:
                continue
            source = read
            self.stats.manifest.append(manifest_entry(source, []))
            block.append({"file_ordinal": ordinal, **asdict(source)})
            if len(block) == self.options.files_per_block:
                blocks.append(pa.Table.from_pylist(block, schema=FILE_BLOCK))
                block = []
        if block:
            blocks.append(pa.Table.from_pylist(block, schema=FILE_BLOCK))
        stored = [] if self.previous is None or not positions else [
            {**row, "ordinal": ordinal} for row, ordinal in
            zip(self.previous.rows(positions).to_pylist(), ordinals, strict=True)]
        return blocks, stored

    def _chunk(self, blocks: list[pa.Table]) -> Any | None:
        """Chunk rows of the changed files (``None`` when no file changed)."""
        data = self.ray.data
        manifest = self.stats.manifest
        reported = self._tallied("chunk")
        if blocks:
            with reported:
                files = data.from_arrow(blocks).map_batches(
                    chunk_block, batch_format="pyarrow", batch_size=None,
                    fn_kwargs={"chunk_cfg": asdict(self.cfg.chunk),
                               "dedupe_cfg": asdict(self.cfg.dedupe),
                               "model": self.model.arguments,
                               "tally": self.tally}).materialize()
            columns = ["file_ordinal", "chunker", "chunk_ids"]
            for batch in files.select_columns(columns).iter_batches(batch_format="pyarrow",
                                                                    batch_size=None):
                for ordinal, chunker, ids in zip(*(batch[c].to_pylist() for c in columns),
                                                 strict=True):
                    manifest[ordinal]["chunk_ids"] = ids
                    self.stats.chunk.chunkers[chunker] += 1
            rows = files.map_batches(explode_chunks, batch_format="pyarrow",
                                     batch_size=None).materialize()
        else:  # no empty dataset: Ray's shuffle would meet its schema-less blocks
            rows = None
        self.stats.chunk.files = len(manifest)
        self.stats.chunk.chunks = sum(len(entry["chunk_ids"]) for entry in manifest)
        self.stats.row_ids.update(i for entry in manifest for i in entry["chunk_ids"])
        self.progress.advance("chunk", reported.rest(self.stats.chunk.chunks))
        return rows

    def _dedupe(self, rows: Any | None, stored: list[dict[str, Any]],
                ) -> tuple[Any | None, set[str]]:
        """Rows to write with their verdicts (``None`` when there are none), and the
        exemplars whose codes they copy."""
        data, cfg = self.ray.data, self.cfg.dedupe
        parts = [rows.select_columns(PARTICIPANT_COLUMNS)] if rows is not None else []
        if stored:
            parts.append(data.from_arrow(pa.Table.from_pylist(
                stored, schema=CHUNK_ROW).select(PARTICIPANT_COLUMNS)))
        participants = _union(parts)
        partitions = max(2, int(self.resources.get("CPU", 1)))
        found = participants.map_batches(
            dedupe_keys, batch_format="pyarrow", batch_size=None,
            fn_kwargs={"rows_per_band": rows_per_band(cfg.near_threshold, cfg.num_perm)},
        ).groupby(["kind", "key"], num_partitions=partitions).map_groups(
            dedupe_group, batch_format="pyarrow", fn_kwargs={"threshold": cfg.near_threshold})
        exact: dict[int, tuple[int, str]] = {}
        pairs: list[Candidate] = []
        for batch in found.iter_batches(batch_format="pyarrow", batch_size=None):
            for later, earlier, earlier_id, similarity in zip(
                    *(batch[c].to_pylist() for c in PAIRS.names), strict=True):
                if similarity is None:
                    exact[later] = (earlier, earlier_id)
                else:
                    pairs.append(Candidate(later, earlier, earlier_id, similarity))
        verdicts = resolve_duplicates(exact, pairs, self.stats.dedupe)
        # unchanged exemplars keep their stored vectors: reused, as the local engine counts them
        self.stats.embed.reused = sum(1 for r in stored if r["dup_of"] is None
                                      and r["ordinal"] not in verdicts)
        parts = [rows.map_batches(attach_verdicts, batch_format="pyarrow", batch_size=None,
                                  fn_kwargs={"verdicts": verdicts})] if rows is not None else []
        moved = [{**r, "dup_of": verdicts.get(r["ordinal"])} for r in stored
                 if verdicts.get(r["ordinal"]) != r["dup_of"]]
        if moved:  # an unchanged file whose duplicate verdict moved is written again
            parts.append(data.from_arrow(pa.Table.from_pylist(moved, schema=CHUNK_ROW)))
        if not parts:
            return None, set()
        rows = _union(parts).materialize()
        needed = {v for b in rows.select_columns(["dup_of"]).iter_batches(
            batch_format="pyarrow", batch_size=None) for v in b["dup_of"].to_pylist() if v}
        return rows, needed

    def _actors(self) -> tuple[int, float, float]:
        gpus, cpus = float(self.resources.get("GPU", 0)), float(self.resources.get("CPU", 1))
        per_gpu = self.options.gpus_per_actor
        if per_gpu is None:
            per_gpu = 1.0 if gpus else 0.0
        actors = self.options.embed_actors or (
            max(1, int(gpus // per_gpu)) if per_gpu else max(1, int(cpus) // 2))
        cpus_per_actor = 1.0 if per_gpu else max(1.0, cpus // actors)
        return actors, cpus_per_actor, per_gpu

    def _embed(self, rows: Any, explicit: str | None) -> tuple[Any, set[str]]:
        actors, cpus_per_actor, gpus_per_actor = self._actors()
        previous = self.previous
        reuse = (str(self.plan.index_path), previous.head.table_version,
                 previous.head.quantization) if previous and previous.vectors_reusable else None
        if explicit:  # a backend the actors cannot run fails here, as a local build's does
            self._preflight(explicit, cpus_per_actor, gpus_per_actor)
        with self._tallied("embed", self.stats.chunk.chunks) as reported:
            embedded = rows.map_batches(
                EmbedActor, batch_format="pyarrow", num_cpus=cpus_per_actor,
                compute=self.ray.data.ActorPoolStrategy(size=actors),
                num_gpus=gpus_per_actor or None, batch_size=self.options.rows_per_embed_batch,
                fn_constructor_kwargs={
                    "model": self.model.arguments,
                    "batch_tokens": self.cfg.embed.batch_tokens, "explicit": explicit,
                    "model_key": self.plan.model_key, "quantization": self.cfg.quantization,
                    "previous": reuse, "tally": self.tally},
                runtime_env={"env_vars": {"OMP_NUM_THREADS": str(int(cpus_per_actor))}},
            ).materialize()
        backends: set[str] = set()
        for batch in embedded.select_columns([name for name, _ in ACTOR_COLUMNS]).iter_batches(
                batch_format="pyarrow", batch_size=None):
            fresh = int(pc.sum(batch["_embedded"]).as_py() or 0)
            self.stats.embed.embedded += fresh
            self.stats.embed.reused += batch.num_rows - fresh
            backends.update(batch["_backend"].unique().to_pylist())
            for name in ("tokens", "padded_tokens", "truncated"):
                total = getattr(self.encode, name) + int(pc.sum(batch[f"_{name}"]).as_py() or 0)
                setattr(self.encode, name, total)
            self.encode.texts += fresh
        self.progress.advance("embed", reported.rest(self.stats.chunk.chunks))
        return embedded.drop_columns([name for name, _ in ACTOR_COLUMNS]).materialize(), backends

    def _preflight(self, explicit: str, cpus: float, gpus: float) -> None:
        """Create and probe ``explicit`` in a task holding an actor's resources. Ray Data
        reports an actor's failure as text alone (its traceback), so the task returns
        the error as data and it is raised again here, whole."""
        task = self.ray.remote(preflight).options(num_cpus=cpus, num_gpus=gpus or None)
        failure = self.ray.get(task.remote(self.model.arguments, explicit))
        if failure:
            raise ERRORS[failure["error"]](failure["message"])

    def _copy_duplicates(self, rows: Any, embedded: Any, needed: set[str]) -> Any:
        codes: dict[str, tuple[bytes, float]] = {}
        if needed:
            for batch in embedded.select_columns(["id", "vec_codes", "vec_scale"]).iter_batches(
                    batch_format="pyarrow", batch_size=None):
                wanted = pc.is_in(batch["id"], pa.array(sorted(needed)))
                for row in batch.filter(wanted).to_pylist():
                    codes[row["id"]] = (row["vec_codes"], row["vec_scale"])
        if self.previous is not None and needed - codes.keys():
            position = self.previous.position
            kept = self.previous.rows([position[i] for i in sorted(needed - codes.keys())],
                                      ["id", "vec_codes", "vec_scale"])
            for row in kept.to_pylist():
                codes[row["id"]] = (row["vec_codes"], row["vec_scale"])
        return rows.map_batches(select_rows, batch_format="pyarrow", batch_size=None,
                                fn_kwargs={"duplicates": True}).map_batches(
            copy_exemplar_codes, batch_format="pyarrow", batch_size=None,
            fn_kwargs={"codes": codes, "model_key": self.plan.model_key})

    def _commit_fragments(self, records: Any, writer: TableWriter) -> int:
        uri = str(table_path(writer.index))
        written = records.map_batches(write_fragments, batch_format="pyarrow", batch_size=None,
                                      fn_kwargs={"uri": uri}).take_all()
        writer.rows_written = sum(row["rows"] for row in written)
        return writer.commit_fragments([row["fragment"] for row in written])


def _union(datasets: list[Any]) -> Any:
    return datasets[0].union(*datasets[1:]) if len(datasets) > 1 else datasets[0]


def _record_batches(records: Any) -> Iterator[pa.RecordBatch]:
    for table in records.iter_batches(batch_format="pyarrow", batch_size=None):
        yield from table.select(CHUNK_SCHEMA.names).cast(CHUNK_SCHEMA).to_batches()
