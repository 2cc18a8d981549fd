"""Stage 1: fbank features of every set, computed once by every process of every node.

Reads  <data-dir>/<set>/data.jsonl (stage 0) and the model config's ``frontend_conf``.
``work`` (each rank) writes  <dump-dir>/<set>/shards/NNNNN.{ark,scp,jsonl,rejected.tsv,stats.npz,done}
for its shards: fixed runs of ``--shard-size`` jobs (a job is one utterance at one speed; the
training set gets one job per ``--speed-perturb`` factor, other sets only 1.0), shard i on rank
i % world-size. A shard whose ``.done`` matches the inputs is not recomputed.
``merge`` (node 0) waits for all shards and writes  <dump-dir>/<set>/{data.jsonl,feats.scp,
rejected.tsv,report.json}, <dump-dir>/<train-set>/am.mvn (and am.lfr<m>x<n>.mvn, which stays valid when
another config with other LFR settings rewrites am.mvn) and, for a from-scratch model, the tokenizer.

The JSONL keeps stage 0's fields; ``source`` becomes ``<ark>:<offset>`` and ``source_len`` the number
of 10 ms fbank frames (before low-frame-rate stacking), which is what ``batch_size`` then counts.

  python -m local.compute_fbank work --rank 0 --world-size 2 --config conf/tiny_sensevoice.yaml \
      --sets "dev train" --train-set train
  python -m local.compute_fbank merge --world-size 2 --config conf/tiny_sensevoice.yaml \
      --sets "dev train" --train-set train --tokenizer-dir dump/tokenizer/tiny_sensevoice
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import sys
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

import kaldiio
import numpy as np

from local.audio import AudioError, load_audio
from local.bad_input import REJECTED_HEADER, BadInputError, Rejection, split_overrides, str2bool
from local.cmvn import CmvnStats, write_am_mvn
from local.dist_slice import marker_matches, my_shards, num_shards, wait_for_shards
from local.fbank import FbankExtractor
from local.log_utils import Progress, setup_logging
from local.model_config import FbankConf, fbank_conf, load_config, pretrained_model, tokenizer_spec

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
        return marker_matches(self.shard_path(shard, "done"), self.fingerprint)


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
    fingerprint = hashlib.sha1(json.dumps([digest.hexdigest(), conf.fingerprint(), factors, shard_size])
                               .encode()).hexdigest()[:16]
    return SetPlan(name, jsonl, dump_dir / name, n_lines, factors, shard_size, fingerprint)


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
                        raise BadInputError(rejection.message())
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
    done = plan.shard_path(shard, "done")
    done.with_suffix(".tmp").write_text(f"{plan.fingerprint}\n{json.dumps(summary)}\n", encoding="utf-8")
    done.with_suffix(".tmp").replace(done)
    return summary


def plans(args: argparse.Namespace, conf: FbankConf) -> list[SetPlan]:
    factors = tuple(float(f) for f in args.speed_perturb.split())
    if not factors or any(not 0.5 <= f <= 2.0 for f in factors):
        raise ValueError(f"--speed-perturb '{args.speed_perturb}': factors must lie in [0.5, 2]")
    return [plan_set(args.data_dir, args.dump_dir, name, factors if name == args.train_set else (1.0,),
                     args.shard_size, conf) for name in args.sets.split()]


def work(args: argparse.Namespace, conf: FbankConf) -> None:
    """Compute this rank's unfinished shards of every set."""
    extractor = FbankExtractor(conf)
    for plan in plans(args, conf):
        mine = my_shards(plan.n_shards, args.rank, args.world_size)
        todo = [s for s in mine if not plan.shard_done(s)]
        log.info("%s: rank %d of %d: %d of its %d shards to compute (%d jobs in all, %s)", plan.out,
                 args.rank, args.world_size, len(todo), len(mine), plan.n_jobs,
                 "speeds " + "/".join(f"{f:g}" for f in plan.factors))
        if not todo:
            continue
        (plan.out / "shards").mkdir(parents=True, exist_ok=True)
        lines = read_shard_lines(plan, todo)
        total = sum(min((s + 1) * plan.shard_size, plan.n_jobs) - s * plan.shard_size for s in todo)
        progress = Progress(f"{plan.out}: rank {args.rank} fbank", total, logger=log)
        audio_s = compute_s = 0.0
        for shard in todo:
            summary = compute_shard(plan, shard, lines.pop(shard, []), extractor, args.strict, progress)
            audio_s += summary["audio_s"]
            compute_s += summary["compute_s"]
        progress.close()
        log.info("%s: rank %d: %.0f s of audio in %.1f s (%.0fx realtime)", plan.out, args.rank, audio_s,
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
            summary = json.loads(plan.shard_path(shard, "done").read_text(encoding="utf-8").split("\n")[1])
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


def cmvn_name(conf: FbankConf) -> str:
    """The am.mvn of one LFR setting: its dimension and statistics depend on lfr_m and lfr_n."""
    return f"am.lfr{conf.lfr_m}x{conf.lfr_n}.mvn"


def merge(args: argparse.Namespace, conf: FbankConf) -> None:
    """Node 0: merge every set, write am.mvn from the training set and build the tokenizer."""
    cfg = load_config(args.config, args.overrides)
    for plan in plans(args, conf):
        _, stats = merge_set(plan, conf, args.world_size, args.wait_timeout)
        if plan.name == args.train_set:
            mean, std = stats.mean_std()
            write_am_mvn(plan.out / "am.mvn", mean, std)
            write_am_mvn(plan.out / cmvn_name(conf), mean, std)
            log.info("%s: global CMVN over %d frames of dim %d (LFR m=%d n=%d)", plan.out / "am.mvn",
                     stats.count, mean.shape[0], conf.lfr_m, conf.lfr_n)
            if pretrained_model(cfg):
                log.info("fine-tuning %s: training keeps the pretrained model's own am.mvn; %s is written "
                         "for reference only", pretrained_model(cfg), plan.out / "am.mvn")
    spec = tokenizer_spec(cfg)
    if spec is None:
        log.info("no tokenizer to build: %s", f"{pretrained_model(cfg)} brings its own"
                 if pretrained_model(cfg) else f"{args.config} has no build_tokenizer section")
        return
    from local.make_tokenizer import build_tokenizer  # sentencepiece is only needed here

    model = build_tokenizer(args.data_dir / args.train_set / "data.jsonl", args.tokenizer_dir, **spec)
    log.info("tokenizer for %s: %s", args.config, model)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("work", "merge"))
    parser.add_argument("--config", type=Path, required=True, help="model config (conf/*.yaml)")
    parser.add_argument("--data-dir", type=Path, default=Path("data"))
    parser.add_argument("--dump-dir", type=Path, default=Path("dump"))
    parser.add_argument("--sets", required=True, help="space-separated set names")
    parser.add_argument("--train-set", required=True, help="the set that is speed-perturbed and gives CMVN")
    parser.add_argument("--speed-perturb", default="1.0",
                        help="factors for the training set, e.g. '0.9 1.0 1.1'")
    parser.add_argument("--shard-size", type=int, default=1000, help="jobs per shard (unit of resumption)")
    parser.add_argument("--rank", type=int, default=int(os.environ.get("RANK", 0)),
                        help="global rank of this process (work; default: $RANK)")
    parser.add_argument("--world-size", type=int, default=1, help="processes over all nodes")
    parser.add_argument("--strict", type=str2bool, default=False, help="stop at the first bad utterance")
    parser.add_argument("--wait-timeout", type=float, default=7200, help="merge: seconds to wait for shards")
    parser.add_argument("--tokenizer-dir", type=Path, default=Path("dump/tokenizer"))
    own, overrides = split_overrides(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(own)
    args.overrides = overrides  # Hydra overrides of the config, as run.sh passes them after --
    setup_logging()
    try:
        conf = fbank_conf(load_config(args.config, args.overrides))
        work(args, conf) if args.mode == "work" else merge(args, conf)
    except BadInputError as e:
        log.error("strict mode: %s", e)
        return 1
    except (FileNotFoundError, ValueError, TimeoutError) as e:
        log.error("%s", e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
