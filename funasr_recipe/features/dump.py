"""Stage 1's feature shards: plan each set, compute this rank's shards, merge them on node 0.

Reads  <data-dir>/<set>/data.jsonl (stage 0's manifest) and a ``FbankConf`` (the model's frontend).
``compute_shards`` (each rank) writes <dump-dir>/<set>/shards/NNNNN.{ark,scp,jsonl,rejected.tsv,
stats.npz,done} for its shards: fixed runs of jobs (a job is one utterance at one speed; the training set
gets one job per speed-perturbation factor, other sets only 1.0), shard i on rank i % world-size. A run
is ``--shard-size`` jobs, or fewer for a set too small to give every process a shard of that size
(dist/slicing.py ``shard_size_for``: 500 jobs on 2 processes make 2 shards of 250, not 1 of 500 that
leaves rank 1 idle); such a set's shards then depend on the number of processes, and a rerun with
another number recomputes them. A shard whose ``.done`` marker matches the inputs, and whose files still
match the size and crc32 the marker records of them (features/shard_sums.py), is not recomputed: a
truncated or corrupted shard is computed again, never certified again.
``merge_set`` (node 0) waits for all shards, checks each against its record (one that fails loses its
marker and stops the merge) and writes <dump-dir>/<set>/{data.jsonl,feats.scp,rejected.tsv,report.json};
``write_cmvn`` writes the training set's am.mvn (and am.lfr<m>x<n>.mvn, which stays valid when another
config with other LFR settings rewrites am.mvn).

Any failure of one utterance (unreadable audio, an exception in resampling or fbank) is that
utterance's rejection (file, line, key, reason), fatal under --strict. A key written twice (a user key
``sp0.9-X`` next to X perturbed at 0.9) stops the shard or the merge with a ValueError naming both
stage-0 lines: kaldiio would write both and the scp point them at one offset.

The JSONL keeps stage 0's fields; ``source`` becomes ``<ark>:<offset>`` and ``source_len`` the number
of 10 ms fbank frames (before low-frame-rate stacking), which is what ``batch_size`` then counts. The arks
hold float32 matrices, or Kaldi's 2-byte compressed ones with storage "uint16" (features/storage.py: half
the bytes); the CMVN statistics are those of the matrices as they are read back.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from array import array
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import kaldiio
import numpy as np

from funasr_recipe.core.log import Progress
from funasr_recipe.core.rejections import REJECTED_HEADER, BadInputError, Rejection
from funasr_recipe.dist.markers import fingerprint, is_done, mark_done, marker_info, wait_for_shards
from funasr_recipe.dist.slicing import my_shards, num_shards, shard_size_for
from funasr_recipe.features.audio import AudioError, load_audio
from funasr_recipe.features.augment import OFF, AugmentConf, Augmenter
from funasr_recipe.features.cmvn import CmvnStats, cmvn_name, write_am_mvn
from funasr_recipe.features.fbank_conf import to_mono
from funasr_recipe.features.shard_sums import RECORD, check_shards, recheck, record, refuse_merge
from funasr_recipe.features.storage import DEFAULT as DEFAULT_STORAGE
from funasr_recipe.features.storage import compression, stored

if TYPE_CHECKING:  # fbank imports torch (2 s): the merge's readers (features/targets.py, results) need none
    from funasr_recipe.features.fbank import FbankConf, FbankExtractor

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SetPlan:
    """Everything that decides a set's shards; its fingerprint invalidates shards made otherwise."""

    name: str
    jsonl: Path
    out: Path
    n_lines: int
    factors: tuple[float, ...]
    shard_size: int
    fingerprint: str
    storage: str = DEFAULT_STORAGE  # features/storage.py: how the arks hold the matrices
    augment: AugmentConf = OFF  # features/augment.py: the training set's, off for the others

    @property
    def n_jobs(self) -> int:
        return self.n_lines * len(self.factors)

    @property
    def n_shards(self) -> int:
        return num_shards(self.n_jobs, self.shard_size)

    def shard_path(self, shard: int, suffix: str) -> Path:
        return self.out / "shards" / f"{shard:05d}.{suffix}"

    def shard_done(self, shard: int) -> bool:
        return is_done(self.shard_path(shard, "done"), self.fingerprint)


def plan_set(data_dir: Path, dump_dir: Path, name: str, factors: tuple[float, ...], shard_size: int,
             conf: FbankConf, world_size: int = 1, storage: str = DEFAULT_STORAGE,
             augment: AugmentConf = OFF) -> SetPlan:
    """Plan one set: count its lines and fingerprint its input, features, perturbation, augmentation and
    storage; shards of ``shard_size`` jobs at most, fewer where that would leave one of ``world_size``
    processes idle."""
    jsonl = data_dir / name / "data.jsonl"
    if not jsonl.is_file():
        raise FileNotFoundError(f"{jsonl} is missing: run stage 0 first")
    digest, n_lines = hashlib.sha1(), 0
    with open(jsonl, "rb") as f:
        for line in f:
            digest.update(line)
            n_lines += 1
    shard_size = shard_size_for(n_lines * len(factors), shard_size, world_size)
    # "v2": the shard markers' layout of dist/markers.py (summary on line 3); older shards are redone.
    # The listing of what stage 0 read (data/sources.py): a recording replaced by one with the same header
    # leaves data.jsonl as it was, and its features must still be computed again.
    # The storage and the augmentation only when not the defaults: shards made before they were choices
    # stay valid.
    fp = fingerprint("stage-1 shard v2", digest.hexdigest(), conf.fingerprint(), factors, shard_size,
                     *([f"storage {storage}"] if compression(storage) is not None else []),
                     *([augment.fingerprint()] if augment.active else []),
                     contents=[data_dir / ".sources.tsv"])
    return SetPlan(name, jsonl, dump_dir / name, n_lines, factors, shard_size, fp, storage, augment)


def speed_key(key: str, factor: float) -> str:
    """Kaldi's name for a perturbed copy: ``sp0.9-<key>``; the original keeps its key."""
    return key if factor == 1.0 else f"sp{factor:g}-{key}"


def shard_lines(plan: SetPlan, shards: list[int]) -> Iterator[tuple[int, list[tuple[int, dict]]]]:
    """(shard, its (line number, parsed line) list) of the given shards in ascending order, each as soon
    as the one pass over the jsonl has read its last line: a shard's lines are a contiguous run, so only
    the shard being read is held (and the next, where a line's speed copies straddle the boundary)."""
    n_factors, size = len(plan.factors), plan.shard_size
    wanted = sorted(set(shards))
    want = set(wanted)
    pending: dict[int, list[tuple[int, dict]]] = defaultdict(list)
    with open(plan.jsonl, encoding="utf-8") as f:
        for index, line in enumerate(f):
            first, last = index * n_factors // size, ((index + 1) * n_factors - 1) // size
            while wanted and wanted[0] < first:  # every line of it has been read
                want.discard(shard := wanted.pop(0))
                yield shard, pending.pop(shard, [])
            if not wanted:
                return
            if mine := [s for s in range(first, last + 1) if s in want]:
                obj = json.loads(line)
                for shard in mine:
                    pending[shard].append((index + 1, obj))
    for shard in wanted:
        yield shard, pending.pop(shard, [])


def feature_error(e: Exception, source: str) -> AudioError:
    """An unexpected exception of one utterance's audio or fbank as its ``feature_error`` rejection."""
    return AudioError("feature_error", f"{type(e).__name__}: {e} ({source})")


def _features(extractor: FbankExtractor, wave: np.ndarray, rate: int, factor: float, source: str,
              augmenter: Augmenter | None = None,
              key: str = "") -> tuple[np.ndarray | None, AudioError | None, list[str]]:
    """(fbank or None, the job's rejection or None, what ``augmenter`` did to job ``key``'s audio)."""
    done: list[str] = []
    try:
        if augmenter is not None:
            wave, done = augmenter(to_mono(wave), rate, key)
        feats = extractor.from_wave(wave, rate, factor)
    except Exception as e:  # torchaudio asserts on a 1-sample clip; any other error is this clip's too
        return None, feature_error(e, source), []
    if not np.isfinite(feats).all():
        return None, AudioError("nonfinite_features", f"{source}: NaN or inf in fbank"), []
    return feats, None, done


def key_origins(plan: SetPlan, keys: set[str]) -> dict[str, list[tuple[int, str, float]]]:
    """(stage-0 line, stage-0 key, speed) of every job that gives one of ``keys``, in one pass."""
    found: dict[str, list[tuple[int, str, float]]] = defaultdict(list)
    with open(plan.jsonl, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            key = json.loads(line)["key"]
            for factor in plan.factors:
                if speed_key(key, factor) in keys:
                    found[speed_key(key, factor)].append((lineno, key, factor))
    return found


def duplicate_key_error(plan: SetPlan, key: str) -> ValueError:
    """The error for a key that two jobs of a set write: it names the stage-0 lines of both."""
    origins = key_origins(plan, {key})[key]
    jobs = " and ".join(f"{plan.jsonl}:{line} (key {k!r} at speed {f:g})" for line, k, f in origins)
    return ValueError(f"{plan.out}: key {key!r} is written twice, for {jobs}; keys must be unique "
                      "(speed perturbation names its copies sp<factor>-<key>): rename one in stage 0's data")


def compute_shard(plan: SetPlan, shard: int, lines: list[tuple[int, dict]], extractor: FbankExtractor,
                  strict: bool, progress: Progress, augmenter: Augmenter | None = None) -> dict:
    """Write one shard's ark/scp/jsonl/rejected/stats and its ``.done``; returns its summary."""
    conf, n_factors = extractor.conf, len(plan.factors)
    augmented: Counter = Counter()
    lo, hi = shard * plan.shard_size, min((shard + 1) * plan.shard_size, plan.n_jobs)
    plan.shard_path(shard, "done").unlink(missing_ok=True)
    stats, reasons = CmvnStats(), Counter()
    accepted: list[tuple[str, dict, int]] = []
    audio_s = 0.0
    start = time.perf_counter()
    # Absolute paths in the scp and JSONL: training may run from another directory.
    ark, scp = plan.shard_path(shard, "ark").resolve(), plan.shard_path(shard, "scp").resolve()
    method = compression(plan.storage)
    with kaldiio.WriteHelper(f"ark,scp:{ark},{scp}", compression_method=method) as writer, \
            open(plan.shard_path(shard, "rejected.tsv"), "w", encoding="utf-8") as rej:
        written: set[str] = set()
        for lineno, obj in lines:
            index = lineno - 1
            jobs = [j for j in range(index * n_factors, (index + 1) * n_factors) if lo <= j < hi]
            load_error: AudioError | None = None
            try:
                wave, rate = load_audio(obj["source"])
            except AudioError as e:
                load_error = e
            except Exception as e:  # one utterance's failure is its rejection, never the whole stage's
                load_error = feature_error(e, obj["source"])
            for job in jobs:
                factor = plan.factors[job % n_factors]
                key = speed_key(obj["key"], factor)
                if load_error is None:
                    feats, error, done = _features(extractor, wave, rate, factor, obj["source"], augmenter,
                                                   key)
                    augmented.update(done)
                else:
                    feats, error = None, load_error
                if error is not None:
                    rejection = Rejection(str(plan.jsonl), lineno, key, error.reason, error.detail)
                    if strict:
                        raise rejection.fatal()
                    reasons[error.reason] += 1
                    rej.write(rejection.tsv())
                    continue
                if key in written:  # kaldiio would write both, and the scp point them at one offset
                    raise duplicate_key_error(plan, key)
                written.add(key)
                writer[key] = feats
                stats.add_lfr(stored(feats, plan.storage), conf.lfr_m, conf.lfr_n)
                accepted.append((key, {**obj, "speed": factor}, feats.shape[0]))
                audio_s += wave.shape[0] / rate / factor
            progress.update(len(jobs))
    offsets = dict(line.rstrip("\n").split(" ", 1) for line in open(scp, encoding="utf-8"))
    with open(plan.shard_path(shard, "jsonl"), "w", encoding="utf-8") as out:
        for key, obj, frames in accepted:
            obj.pop("sample_rate", None)
            obj.pop("channels", None)  # describe the audio, not the features
            out.write(json.dumps({**obj, "key": key, "source": offsets[key], "source_len": frames,
                                  "wav": obj["source"], "feat_dim": conf.n_mels}, ensure_ascii=False) + "\n")
    stats.save(plan.shard_path(shard, "stats.npz"))
    summary = {"accepted": len(accepted), "rejected": dict(reasons), "frames": sum(f for _, _, f in accepted),
               "augmented": dict(augmented),
               "audio_s": audio_s, "compute_s": time.perf_counter() - start,
               RECORD: record(plan.shard_path(shard, "done"))}
    mark_done(plan.shard_path(shard, "done"), plan.fingerprint, summary)
    return summary


def plan_sets(data_dir: Path, dump_dir: Path, sets: list[str], train_set: str, speed_perturb: str,
              shard_size: int, conf: FbankConf, world_size: int = 1,
              storage: str = DEFAULT_STORAGE, augment: AugmentConf = OFF) -> list[SetPlan]:
    """A plan per set for ``world_size`` processes; ``speed_perturb`` ("0.9 1.0 1.1") and ``augment``
    (features/augment.py) apply to the training set only; every set's arks hold ``storage``
    (features/storage.py)."""
    factors = tuple(float(f) for f in speed_perturb.split())
    if not factors or any(not 0.5 <= f <= 2.0 for f in factors):
        raise BadInputError(f"--speed-perturb '{speed_perturb}': factors must lie in [0.5, 2]")
    # By the keys they give, not the floats: 1.0 and 1, or 0.9 and 0.9000001 ("sp0.9-"), would clash.
    names = Counter(speed_key("", f) for f in factors)
    if twice := [f for f in factors if names[speed_key("", f)] > 1]:
        raise BadInputError(f"--speed-perturb '{speed_perturb}': factor {twice[0]:g} is given more than "
                            "once; each copy of an utterance needs its own key")
    return [plan_set(data_dir, dump_dir, name, factors if name == train_set else (1.0,), shard_size, conf,
                     world_size, storage, augment if name == train_set else OFF) for name in sets]


def compute_shards(plans: list[SetPlan], conf: FbankConf, rank: int, world_size: int, strict: bool) -> None:
    """Compute this rank's unfinished shards of every set."""
    from funasr_recipe.features.fbank import FbankExtractor

    extractor = FbankExtractor(conf)
    for plan in plans:
        mine = my_shards(plan.n_shards, rank, world_size)
        todo = [s for s in mine if not plan.shard_done(s)]
        # A marker vouches for the bytes it recorded, not for what is on disk now.
        finished = {plan.shard_path(s, "done"): s for s in mine if s not in todo}
        failed = recheck(finished, f"{plan.out}: rank {rank}")
        todo = sorted(todo + [finished[m] for m in failed])
        log.info("%s: rank %d of %d: %d of its %d shards to compute (%d jobs in all, %s, %s storage)",
                 plan.out, rank, world_size, len(todo), len(mine), plan.n_jobs,
                 "speeds " + "/".join(f"{f:g}" for f in plan.factors), plan.storage)
        if not todo:
            continue
        (plan.out / "shards").mkdir(parents=True, exist_ok=True)
        total = sum(min((s + 1) * plan.shard_size, plan.n_jobs) - s * plan.shard_size for s in todo)
        progress = Progress(f"{plan.out}: rank {rank} fbank", total, logger=log)
        audio_s = compute_s = 0.0
        augmenter = Augmenter(plan.augment) if plan.augment.active else None
        for shard, lines in shard_lines(plan, todo):
            summary = compute_shard(plan, shard, lines, extractor, strict, progress, augmenter)
            audio_s += summary["audio_s"]
            compute_s += summary["compute_s"]
        progress.close()
        log.info("%s: rank %d: %.0f s of audio in %.1f s (%.0fx realtime)", plan.out, rank, audio_s,
                 compute_s, audio_s / max(compute_s, 1e-9))


def _duplicate_key(scp: Path, hashes: np.ndarray) -> str | None:
    """A key that ``scp`` holds twice, or None; ``hashes`` are the ``hash()`` of its keys in order."""
    ordered = np.sort(hashes)
    twice = set(ordered[1:][ordered[1:] == ordered[:-1]].tolist())
    if not twice:
        return None
    seen: set[str] = set()
    with open(scp, encoding="utf-8") as f:
        for line in f:
            key = line.split(" ", 1)[0]
            if hash(key) in twice:
                if key in seen:
                    return key
                seen.add(key)
    return None


def merge_set(plan: SetPlan, conf: FbankConf, world_size: int, timeout: float) -> tuple[dict, CmvnStats]:
    """Concatenate a set's shards into its data.jsonl/feats.scp/rejected.tsv/report.json."""
    wait_for_shards(plan.shard_done, plan.n_shards, world_size, str(plan.out), timeout)
    # Once, here: the wait polls markers alone every few seconds. A merged list must not name bad bytes.
    if bad := check_shards([plan.shard_path(s, "done") for s in range(plan.n_shards)], f"{plan.out}: merge"):
        raise refuse_merge(str(plan.out), bad)
    stats, reasons, augmented = CmvnStats(), Counter(), Counter()
    totals = Counter()
    parts = {"data.jsonl": "jsonl", "feats.scp": "scp", "rejected.tsv": "rejected.tsv"}
    outs = {name: open(plan.out / f"{name}.tmp", "w", encoding="utf-8") for name in parts}
    # 8 bytes a key (80 MB for 10M keys) rather than a set of strings; a collision is sorted out by name.
    hashes = array("q")
    try:
        outs["rejected.tsv"].write(REJECTED_HEADER)
        for shard in range(plan.n_shards):
            summary = marker_info(plan.shard_path(shard, "done"))
            reasons.update(summary["rejected"])
            augmented.update(summary.get("augmented", {}))
            totals.update({k: summary[k] for k in ("accepted", "frames", "audio_s", "compute_s")})
            stats.merge(CmvnStats.load(plan.shard_path(shard, "stats.npz")))
            for name, suffix in parts.items():
                with open(plan.shard_path(shard, suffix), encoding="utf-8") as f:
                    text = f.read()
                outs[name].write(text)
                if name == "feats.scp":
                    # "\n" only: str.splitlines would also cut a key holding U+2028 into pieces.
                    hashes.extend(hash(line.split(" ", 1)[0]) for line in text.split("\n") if line)
    finally:
        for f in outs.values():
            f.close()
    if (key := _duplicate_key(plan.out / "feats.scp.tmp", np.frombuffer(hashes, dtype=np.int64))) is not None:
        for name in parts:
            (plan.out / f"{name}.tmp").unlink()
        raise duplicate_key_error(plan, key)
    for name in parts:
        (plan.out / f"{name}.tmp").replace(plan.out / name)
    report = {
        "set": plan.name, "input": str(plan.jsonl), "utterances": plan.n_lines,
        "speed_perturb": list(plan.factors), "jobs": plan.n_jobs, "accepted": totals["accepted"],
        **({"augment": asdict(plan.augment), "augmented": dict(sorted(augmented.items()))}
           if plan.augment.active else {}),
        "rejected": sum(reasons.values()), "rejected_by_reason": dict(sorted(reasons.items())),
        "frames": totals["frames"], "hours": round(totals["audio_s"] / 3600, 4),
        "compute_s": round(totals["compute_s"], 2),
        "realtime_factor_per_process": round(totals["audio_s"] / max(totals["compute_s"], 1e-9), 1),
        "shards": plan.n_shards, "fbank": asdict(conf), "storage": plan.storage,
        "fingerprint": plan.fingerprint,
    }
    (plan.out / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    log.info("%s: %d of %d jobs accepted, %d rejected %s; %.2f h of features, %.0fx realtime per process",
             plan.out, report["accepted"], report["jobs"], report["rejected"], report["rejected_by_reason"],
             report["hours"], report["realtime_factor_per_process"])
    if report["rejected"]:
        log.warning("%d rejected jobs are listed in %s", report["rejected"], plan.out / "rejected.tsv")
    if not report["accepted"]:
        raise BadInputError(f"{plan.out}: no features were written; see {plan.out / 'rejected.tsv'}")
    return report, stats


def write_cmvn(plan: SetPlan, stats: CmvnStats, conf: FbankConf) -> None:
    """The training set's global CMVN as am.mvn and as the LFR setting's own am.lfr<m>x<n>.mvn."""
    mean, std = stats.mean_std()
    write_am_mvn(plan.out / "am.mvn", mean, std)
    write_am_mvn(plan.out / cmvn_name(conf), mean, std)
    log.info("%s: global CMVN over %d frames of dim %d (LFR m=%d n=%d)", plan.out / "am.mvn",
             stats.count, mean.shape[0], conf.lfr_m, conf.lfr_n)
