"""Stage 1's feature shards: plan each set, compute this rank's shards, merge them on node 0.

Reads  <data-dir>/<set>/data.jsonl (stage 0's manifest) and a ``FbankConf`` (the model's frontend).
``compute_shards`` (each rank) writes <dump-dir>/<set>/shards/NNNNN.{ark,scp,jsonl,rejected.tsv,
stats.npz,done} for its shards: fixed runs of ``shard_size`` jobs (a job is one utterance at one speed;
the training set gets one job per speed-perturbation factor, other sets only 1.0), shard i on rank
i % world-size. A shard whose ``.done`` marker matches the inputs is not recomputed.
``merge_set`` (node 0) waits for all shards and writes <dump-dir>/<set>/{data.jsonl,feats.scp,
rejected.tsv,report.json}; ``write_cmvn`` writes the training set's am.mvn (and am.lfr<m>x<n>.mvn, which
stays valid when another config with other LFR settings rewrites am.mvn).

The JSONL keeps stage 0's fields; ``source`` becomes ``<ark>:<offset>`` and ``source_len`` the number
of 10 ms fbank frames (before low-frame-rate stacking), which is what ``batch_size`` then counts.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

import kaldiio
import numpy as np

from funasr_recipe.core.log import Progress
from funasr_recipe.core.rejections import REJECTED_HEADER, Rejection
from funasr_recipe.dist.markers import fingerprint, is_done, mark_done, marker_info, wait_for_shards
from funasr_recipe.dist.slicing import my_shards, num_shards
from funasr_recipe.features.audio import AudioError, load_audio
from funasr_recipe.features.cmvn import CmvnStats, cmvn_name, write_am_mvn
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
             conf: FbankConf) -> SetPlan:
    """Plan one set: count its lines and fingerprint its input, features and perturbation."""
    jsonl = data_dir / name / "data.jsonl"
    if not jsonl.is_file():
        raise FileNotFoundError(f"{jsonl} is missing: run stage 0 first")
    digest, n_lines = hashlib.sha1(), 0
    with open(jsonl, "rb") as f:
        for line in f:
            digest.update(line)
            n_lines += 1
    # "v2": the shard markers' layout of dist/markers.py (summary on line 3); older shards are redone.
    fp = fingerprint("stage-1 shard v2", digest.hexdigest(), conf.fingerprint(), factors, shard_size)
    return SetPlan(name, jsonl, dump_dir / name, n_lines, factors, shard_size, fp)


def speed_key(key: str, factor: float) -> str:
    """Kaldi's name for a perturbed copy: ``sp0.9-<key>``; the original keeps its key."""
    return key if factor == 1.0 else f"sp{factor:g}-{key}"


def read_shard_lines(plan: SetPlan, shards: list[int]) -> dict[int, list[tuple[int, dict]]]:
    """(line number, parsed line) of every utterance the given shards need, read in one pass."""
    n_factors, size = len(plan.factors), plan.shard_size
    wanted = set(shards)
    lines: dict[int, list[tuple[int, dict]]] = defaultdict(list)
    with open(plan.jsonl, encoding="utf-8") as f:
        for index, line in enumerate(f):
            first, last = index * n_factors // size, ((index + 1) * n_factors - 1) // size
            for shard in range(first, last + 1):
                if shard in wanted:
                    lines[shard].append((index + 1, json.loads(line)))
    return lines


def compute_shard(plan: SetPlan, shard: int, lines: list[tuple[int, dict]], extractor: FbankExtractor,
                  strict: bool, progress: Progress) -> dict:
    """Write one shard's ark/scp/jsonl/rejected/stats and its ``.done``; returns its summary."""
    conf, n_factors = extractor.conf, len(plan.factors)
    lo, hi = shard * plan.shard_size, min((shard + 1) * plan.shard_size, plan.n_jobs)
    plan.shard_path(shard, "done").unlink(missing_ok=True)
    stats, reasons = CmvnStats(), Counter()
    accepted: list[tuple[str, dict, int]] = []
    audio_s = 0.0
    start = time.perf_counter()
    # Absolute paths in the scp and JSONL: training may run from another directory.
    ark, scp = plan.shard_path(shard, "ark").resolve(), plan.shard_path(shard, "scp").resolve()
    with kaldiio.WriteHelper(f"ark,scp:{ark},{scp}") as writer, \
            open(plan.shard_path(shard, "rejected.tsv"), "w", encoding="utf-8") as rej:
        for lineno, obj in lines:
            index = lineno - 1
            jobs = [j for j in range(index * n_factors, (index + 1) * n_factors) if lo <= j < hi]
            try:
                wave, rate = load_audio(obj["source"])
                error = None
            except AudioError as e:
                error = e
            for job in jobs:
                factor = plan.factors[job % n_factors]
                key = speed_key(obj["key"], factor)
                if error is None:
                    feats = extractor.from_wave(wave, rate, factor)
                    if not np.isfinite(feats).all():
                        error = AudioError("nonfinite_features", f"{obj['source']}: NaN or inf in fbank")
                if error is not None:
                    rejection = Rejection(str(plan.jsonl), lineno, key, error.reason, error.detail)
                    if strict:
                        raise rejection.fatal()
                    reasons[error.reason] += 1
                    rej.write(rejection.tsv())
                    continue
                writer[key] = feats
                stats.add_lfr(feats, conf.lfr_m, conf.lfr_n)
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
               "audio_s": audio_s, "compute_s": time.perf_counter() - start}
    mark_done(plan.shard_path(shard, "done"), plan.fingerprint, summary)
    return summary


def plan_sets(data_dir: Path, dump_dir: Path, sets: list[str], train_set: str, speed_perturb: str,
              shard_size: int, conf: FbankConf) -> list[SetPlan]:
    """A plan per set; ``speed_perturb`` ("0.9 1.0 1.1") applies to the training set only."""
    factors = tuple(float(f) for f in speed_perturb.split())
    if not factors or any(not 0.5 <= f <= 2.0 for f in factors):
        raise ValueError(f"--speed-perturb '{speed_perturb}': factors must lie in [0.5, 2]")
    return [plan_set(data_dir, dump_dir, name, factors if name == train_set else (1.0,), shard_size, conf)
            for name in sets]


def compute_shards(plans: list[SetPlan], conf: FbankConf, rank: int, world_size: int, strict: bool) -> None:
    """Compute this rank's unfinished shards of every set."""
    extractor = FbankExtractor(conf)
    for plan in plans:
        mine = my_shards(plan.n_shards, rank, world_size)
        todo = [s for s in mine if not plan.shard_done(s)]
        log.info("%s: rank %d of %d: %d of its %d shards to compute (%d jobs in all, %s)", plan.out,
                 rank, world_size, len(todo), len(mine), plan.n_jobs,
                 "speeds " + "/".join(f"{f:g}" for f in plan.factors))
        if not todo:
            continue
        (plan.out / "shards").mkdir(parents=True, exist_ok=True)
        lines = read_shard_lines(plan, todo)
        total = sum(min((s + 1) * plan.shard_size, plan.n_jobs) - s * plan.shard_size for s in todo)
        progress = Progress(f"{plan.out}: rank {rank} fbank", total, logger=log)
        audio_s = compute_s = 0.0
        for shard in todo:
            summary = compute_shard(plan, shard, lines.pop(shard, []), extractor, strict, progress)
            audio_s += summary["audio_s"]
            compute_s += summary["compute_s"]
        progress.close()
        log.info("%s: rank %d: %.0f s of audio in %.1f s (%.0fx realtime)", plan.out, rank, audio_s,
                 compute_s, audio_s / max(compute_s, 1e-9))


def merge_set(plan: SetPlan, conf: FbankConf, world_size: int, timeout: float) -> tuple[dict, CmvnStats]:
    """Concatenate a set's shards into its data.jsonl/feats.scp/rejected.tsv/report.json."""
    wait_for_shards(plan.shard_done, plan.n_shards, world_size, str(plan.out), timeout)
    stats, reasons = CmvnStats(), Counter()
    totals = Counter()
    parts = {"data.jsonl": "jsonl", "feats.scp": "scp", "rejected.tsv": "rejected.tsv"}
    outs = {name: open(plan.out / f"{name}.tmp", "w", encoding="utf-8") for name in parts}
    try:
        outs["rejected.tsv"].write(REJECTED_HEADER)
        for shard in range(plan.n_shards):
            summary = marker_info(plan.shard_path(shard, "done"))
            reasons.update(summary["rejected"])
            totals.update({k: summary[k] for k in ("accepted", "frames", "audio_s", "compute_s")})
            stats.merge(CmvnStats.load(plan.shard_path(shard, "stats.npz")))
            for name, suffix in parts.items():
                with open(plan.shard_path(shard, suffix), encoding="utf-8") as f:
                    outs[name].write(f.read())
    finally:
        for f in outs.values():
            f.close()
    for name in parts:
        (plan.out / f"{name}.tmp").replace(plan.out / name)
    report = {
        "set": plan.name, "input": str(plan.jsonl), "utterances": plan.n_lines,
        "speed_perturb": list(plan.factors), "jobs": plan.n_jobs, "accepted": totals["accepted"],
        "rejected": sum(reasons.values()), "rejected_by_reason": dict(sorted(reasons.items())),
        "frames": totals["frames"], "hours": round(totals["audio_s"] / 3600, 4),
        "compute_s": round(totals["compute_s"], 2),
        "realtime_factor_per_process": round(totals["audio_s"] / max(totals["compute_s"], 1e-9), 1),
        "shards": plan.n_shards, "fbank": asdict(conf), "fingerprint": plan.fingerprint,
    }
    (plan.out / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    log.info("%s: %d of %d jobs accepted, %d rejected %s; %.2f h of features, %.0fx realtime per process",
             plan.out, report["accepted"], report["jobs"], report["rejected"], report["rejected_by_reason"],
             report["hours"], report["realtime_factor_per_process"])
    if report["rejected"]:
        log.warning("%d rejected jobs are listed in %s", report["rejected"], plan.out / "rejected.tsv")
    if not report["accepted"]:
        raise ValueError(f"{plan.out}: no features were written; see {plan.out / 'rejected.tsv'}")
    return report, stats


def write_cmvn(plan: SetPlan, stats: CmvnStats, conf: FbankConf) -> None:
    """The training set's global CMVN as am.mvn and as the LFR setting's own am.lfr<m>x<n>.mvn."""
    mean, std = stats.mean_std()
    write_am_mvn(plan.out / "am.mvn", mean, std)
    write_am_mvn(plan.out / cmvn_name(conf), mean, std)
    log.info("%s: global CMVN over %d frames of dim %d (LFR m=%d n=%d)", plan.out / "am.mvn",
             stats.count, mean.shape[0], conf.lfr_m, conf.lfr_n)
