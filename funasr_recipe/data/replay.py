"""Replay: general data mixed into a fine-tune so that the model keeps what it knew (issue #17).

Three pieces, used by stages 0-2:
  - ``write_train_list`` reads stage 1's dump/<train>/data.jsonl and each dump/replay_<name>/data.jsonl
    and writes the one list stage 2 trains on: the new lines, then every pool's lines;
  - ``ReplaySelector`` picks, per epoch, every new utterance plus ratio x as many replay ones, drawn
    anew each epoch from (seed, epoch) alone, so that every rank computes the same list (the batch
    sampler, data/batch_sampler.py, applies it to training, never to validation);
  - ``merge_pseudo_labels`` turns the shards of local/pseudo_label.py (a pretrained model's scored
    hypotheses of audio whose transcripts are gone) into a Kaldi dir that stage 0 takes as a replay set:
    writes <dest>/{wav.scp,text,utt2spk[,utt2lang,utt2emo,utt2event]} and, in the decode dir,
    left_out.tsv (file, line, key, reason, detail) and pseudo_label.json (counts).

  counts = write_train_list(Path("dump/train/data.jsonl"), [Path("dump/replay_zh/data.jsonl")],
                            Path("dump/train/train_replay.jsonl"), data_dir=Path("data"))
  ReplaySelector(is_replay, ratio=1.0, seed=0).epoch_indices(epoch=3)  # sorted dataset indices
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from funasr_recipe.core.files import write_atomic
from funasr_recipe.core.jsonl import iter_jsonl
from funasr_recipe.core.rejections import REJECTED_HEADER, BadInputError, Rejection
from funasr_recipe.data.kaldi_table import iter_table
from funasr_recipe.data.tags import canonical_tag

log = logging.getLogger(__name__)

# Third word of the replay draw's seed: keeps it apart from the batch sampler's [seed, epoch] stream,
# which orders the batches; the two must not be the same numbers.
REPLAY_STREAM = 0x5E1A
# What merge_pseudo_labels leaves out, in the order it checks.
LEFT_OUT_REASONS = ("unreadable", "empty_hypothesis", "low_confidence")
# The Kaldi tag tables stage 0 reads (data/validate.py) and the tag kind each holds.
TAG_TABLES = {"utt2lang": "language", "utt2emo": "emotion", "utt2event": "event"}
_logged: set[str] = set()  # funasr rebuilds the sampler every epoch: say each "pool too small" once


@dataclass
class ReplayCounts:
    """What ``write_train_list`` wrote: the list, its new lines and each replay pool's lines."""

    out: Path
    new: int
    pools: dict[str, int] = field(default_factory=dict)

    @property
    def replay(self) -> int:
        return sum(self.pools.values())


def _copy_lines(path: Path, f, new_sources: set[str] | None, clash_with: set[str] | None,
                train_jsonl: Path | None = None) -> int:
    """Copy the JSON lines of ``path`` to ``f`` (re-serialised: identical bytes on every rank); collect
    their sources into ``new_sources``, or refuse one that is in ``clash_with``. Returns the count."""
    n = 0
    for lineno, obj in iter_jsonl(path):
        source = obj.get("source")
        if not isinstance(source, str):
            raise BadInputError(f"{path}:{lineno}: no 'source': not a data.jsonl line")
        if new_sources is not None:
            new_sources.add(source)
        elif clash_with is not None and source in clash_with:
            # The sampler tells replay from new utterances by source: one in both would be replay only.
            raise BadInputError(f"{path}:{lineno}: source {source} is in the training set {train_jsonl} too; "
                                "leave it out of one of the two")
        f.write(json.dumps(obj, ensure_ascii=False) + "\n")
        n += 1
    return n


def write_train_list(train_jsonl: Path, replay_jsonls: Sequence[Path], out: Path,
                     data_dir: Path | None = None) -> ReplayCounts:
    """Write ``out`` = the lines of ``train_jsonl`` followed by those of each replay pool, atomically
    (every rank may call it with the same inputs and writes the same bytes); returns the counts.

    A pool without a line is an error naming it and stage 0's report of that set
    (``<data_dir>/<pool's folder name>/report.json``, or the report beside the pool without data_dir).
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # Ranks on different nodes can share a pid: the host keeps their temporary names apart.
    tmp = out.with_name(f".{out.name}.tmp.{socket.gethostname()}.{os.getpid()}")
    counts = ReplayCounts(out, 0)
    sources: set[str] = set()
    try:
        with open(tmp, "w", encoding="utf-8", newline="\n") as f:
            counts.new = _copy_lines(Path(train_jsonl), f, sources, None)
            if counts.new == 0:
                raise BadInputError(f"{train_jsonl}: no utterances to fine-tune on")
            for pool in map(Path, replay_jsonls):
                n = _copy_lines(pool, f, None, sources, Path(train_jsonl))
                if n == 0:
                    report = (Path(data_dir) / pool.parent.name if data_dir else pool.parent) / "report.json"
                    raise BadInputError(f"{pool}: no usable utterances; stage 0's report {report} says why")
                counts.pools[str(pool)] = n
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    log.info("%s: %d new + %d replay utterances (%s)", out, counts.new, counts.replay,
             ", ".join(f"{Path(p).parent.name} {n}" for p, n in counts.pools.items()))
    return counts


def funasr_source(source: str) -> str:
    """A manifest's source as funasr's IndexDSJsonl keeps it (it rewrites one Alibaba-internal prefix):
    what the sampler compares with the dataset's own."""
    return source.replace("/cpfs01", "/cpfs_speech/data")


def replay_sources(replay_list: str | Path | Iterable[str | Path]) -> set[str]:
    """The sources (as funasr keeps them) of every line of a replay jsonl or of each of a list of them;
    ValueError when there is none."""
    paths = [replay_list] if isinstance(replay_list, (str, Path)) else list(replay_list)
    found = {funasr_source(str(obj["source"])) for p in paths for _, obj in iter_jsonl(Path(p))
             if "source" in obj}
    if not found:
        raise BadInputError(f"replay_list {', '.join(map(str, paths))}: no line with a source")
    return found


class ReplaySelector:
    """Per epoch: every new utterance plus ``k = round(ratio x new)`` replay ones.

    ``is_replay[i]`` says whether dataset index i is a replay utterance. The k are drawn without
    replacement from ``numpy.random.default_rng([seed, epoch, REPLAY_STREAM])``: a new subset each epoch,
    the same on every rank and on a resumed run. A pool smaller than k is taken whole as many times as
    it fits, plus a draw for the rest. ratio 0 gives the new utterances alone.
    """

    def __init__(self, is_replay: np.ndarray, ratio: float, seed: int = 0) -> None:
        if not (math.isfinite(ratio) and ratio >= 0):
            raise BadInputError(f"replay ratio must be a number >= 0, got {ratio}")
        self.is_replay = np.asarray(is_replay, dtype=bool)
        self.ratio, self.seed = float(ratio), int(seed)

    def replay_count(self, n_new: int) -> int:
        """How many replay utterances an epoch of ``n_new`` new ones takes."""
        return int(round(self.ratio * n_new))

    def epoch_indices(self, epoch: int, kept: np.ndarray | None = None) -> np.ndarray:
        """Sorted dataset indices of ``epoch`` among ``kept`` (all by default); a replay index taken
        more than once (small pool) appears that many times."""
        kept = np.arange(len(self.is_replay)) if kept is None else np.asarray(kept, dtype=np.int64)
        mask = self.is_replay[kept]
        new, pool = kept[~mask], kept[mask]
        k = self.replay_count(len(new))
        if k == 0:
            return new
        if len(pool) == 0:
            raise BadInputError(f"replay ratio {self.ratio} asks for {k} replay utterances and none of the "
                                f"{int(self.is_replay.sum())} replay lines is left after the length limits")
        whole, rest = divmod(k, len(pool))
        if whole:
            message = (f"the replay pool holds {len(pool)} utterances, ratio {self.ratio} asks for {k} per "
                       f"epoch: each is used {whole} or {whole + 1} times")
            if message not in _logged:
                _logged.add(message)
                log.warning("%s", message)
        rng = np.random.default_rng([self.seed, int(epoch), REPLAY_STREAM])
        drawn = rng.choice(pool, rest, replace=False)
        return np.sort(np.concatenate([new, np.tile(pool, whole), drawn]))


def wav_scp_items(wav_scp: Path) -> list[tuple[int, dict]]:
    """(line, {"key", "source"}) of every entry of a wav.scp, in file order; ValueError naming the line of
    a key given twice (its pseudo-label would be ambiguous)."""
    seen: dict[str, int] = {}
    items = []
    for rec in iter_table(wav_scp):
        if rec.key in seen:
            raise BadInputError(f"{wav_scp}:{rec.lineno}: key {rec.key} is on line {seen[rec.key]} too")
        if not rec.value:
            raise BadInputError(f"{wav_scp}:{rec.lineno}: key {rec.key} has no audio")
        seen[rec.key] = rec.lineno
        items.append((rec.lineno, {"key": rec.key, "source": rec.value}))
    if not items:
        raise BadInputError(f"{wav_scp}: no entries")
    return items


def pseudo_label_dest(dest: Path, rows: list[tuple[str, str, str, dict[str, str]]],
                      speakers: dict[str, str]) -> None:
    """Write the Kaldi dir of kept pseudo-labels: rows of (key, wav.scp value, text, {kind: tag name})."""
    dest.mkdir(parents=True, exist_ok=True)
    write_atomic(dest / "wav.scp", "".join(f"{k} {src}\n" for k, src, _, _ in rows))
    write_atomic(dest / "text", "".join(f"{k} {text}\n" for k, _, text, _ in rows))
    # Without the dir's utt2spk, each utterance is its own speaker (Kaldi's convention).
    write_atomic(dest / "utt2spk", "".join(f"{k} {speakers.get(k, k)}\n" for k, _, _, _ in rows))
    for table, kind in TAG_TABLES.items():
        lines = [f"{k} {tags[kind]}\n" for k, _, _, tags in rows if kind in tags]
        if lines:  # a key without a line gets stage 0's declared default
            write_atomic(dest / table, "".join(lines))
        else:
            (dest / table).unlink(missing_ok=True)


def merge_pseudo_labels(shards: Iterable[dict], wav_scp: Path, min_logprob: float, dest: Path,
                        out: Path) -> dict:
    """Judge every utterance of ``wav_scp`` by its shard record (local/pseudo_label.py work), write the
    kept ones to ``dest`` (``pseudo_label_dest``), the others to ``out``/left_out.tsv with the reason,
    and the counts to ``out``/pseudo_label.json; returns them. ValueError when none is kept.

    Left out, in this order: unreadable audio; an empty hypothesis (no word, or no token emitted in the
    audio frames); a mean log-probability below ``min_logprob``. A record without a score (a family whose
    inference has no CTC: Paraformer) is kept when it is not empty.
    """
    hyps = {obj["key"]: obj for obj in shards}
    spk_file = wav_scp.parent / "utt2spk"
    speakers = {rec.key: rec.value for rec in iter_table(spk_file)} if spk_file.is_file() else {}
    kept: list[tuple[str, str, str, dict[str, str]]] = []
    left: list[Rejection] = []
    unscored = 0
    for lineno, item in wav_scp_items(wav_scp):
        key, h = item["key"], hyps.get(item["key"])
        if h is None:  # a shard that misses utterances is a bug or an edited wav.scp
            raise RuntimeError(f"{wav_scp}:{lineno}: {key} is in no shard; remove {out / 'shards'} "
                               "and decode again")
        lp = h.get("logprob")
        if "error" in h:
            left.append(Rejection(str(wav_scp), lineno, key, "unreadable",
                                  f"{h['error']}: {h['detail']}"))
        elif not h["text"] or h.get("n_tokens") == 0:
            left.append(Rejection(str(wav_scp), lineno, key, "empty_hypothesis", repr(h["raw"])))
        elif lp is not None and lp < min_logprob:
            left.append(Rejection(str(wav_scp), lineno, key, "low_confidence",
                                  f"mean log-probability {lp:.4f} < {min_logprob}: {h['raw']}"))
        else:
            unscored += lp is None
            tags = {kind: h[kind] for kind in TAG_TABLES.values() if canonical_tag(kind, h.get(kind, ""))}
            kept.append((key, item["source"], h["text"], tags))
    write_atomic(out / "left_out.tsv", REJECTED_HEADER + "".join(r.tsv() for r in left))
    reasons = Counter(r.reason for r in left)
    summary = {"utterances": len(kept) + len(left), "kept": len(kept),
               "left_out": {reason: reasons.get(reason, 0) for reason in LEFT_OUT_REASONS},
               "min_logprob": min_logprob, "unscored": unscored, "dest": str(dest)}
    write_atomic(out / "pseudo_label.json", json.dumps(summary, indent=2) + "\n")
    if unscored:
        log.warning("%d hypotheses have no confidence (the model's family has no CTC in its inference): "
                    "--min-logprob is not applied to them, only empty ones are left out", unscored)
    log.info("pseudo-labels of %s: %d of %d kept, left out: %s (listed in %s)", wav_scp, len(kept),
             summary["utterances"], ", ".join(f"{n} {r}" for r, n in summary["left_out"].items()),
             out / "left_out.tsv")
    if not kept:
        scores = [h["logprob"] for h in hyps.values() if h.get("logprob") is not None]
        best = f"; the best mean log-probability is {max(scores):.4f}" if scores else ""
        raise BadInputError(f"pseudo-labels of {wav_scp}: none of {len(left)} utterances is kept "
                            f"(--min-logprob {min_logprob}{best}); see {out / 'left_out.tsv'}")
    pseudo_label_dest(dest, kept, speakers)
    return summary
