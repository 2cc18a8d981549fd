"""Every utterance stage 2 will not train or validate on, named before training starts.

funasr drops utterances silently: its index (``IndexDSJsonl``, all three registered names, and the recipe's
``IndexDSJsonlMmap`` alike) keeps a data.jsonl line only when min_source_length <= source_len <=
max_source_length, min_target_length <= target_len <= max_target_length and source_len + target_len <=
max_token_length (dataset_conf, defaults 0/2048, 0/2048, 2200), and logs nothing but ``total_num of
samplers``. The batch sampler drops more: funasr's ``BatchSampler`` family source_len > max_token_length
(token batches: default 2048, so with max_token_length unset it is stricter than the index's 2200; example
batches: only when set, on source_len / length_scale_source), the recipe's LengthBucketBatchSampler
source_len > max_token_length when set. With --feats-type raw, funasr's SenseVoice datasets replace an
utterance by a random other one when its frontend output has more frames than batch_size (whatever
batch_type says) or its transcript more than 200 tokens; the recipe's Fbank* datasets (stage-1 features, the
default) have neither check.
``find_skips`` applies exactly these rules to the resolved config (model/trainer.py ``resolved_config``):
the index's and the samplers' from the JSONL's numbers, as they do; the raw frames check from source_len
and, for the utterances whose source_len cannot tell (it is cut to 10 ms), from the recording's header.

Reads  the resolved config and its train_data_set_list / valid_data_set_list (data.jsonl, or a list
       file of them); writes <exp-dir>/train_skipped.tsv (set, key, reason, detail: one row per limit an
       utterance breaks, since raising one limit alone may not bring it back), global rank 0 only.

  check(hydra_args, strict=False)   # every rank, before funasr's main_hydra
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.model.trainer import resolved_config

log = logging.getLogger(__name__)
HEADER = "set\tkey\treason\tdetail\n"
FILE = "train_skipped.tsv"
# funasr's three names, and the recipe's mapped index with the same filters (data/index_ds.py).
INDEX_CLASSES = ("IndexDSJsonl", "IndexDSJsonlRankFull", "IndexDSJsonlRankSplit", "IndexDSJsonlMmap")
FUNASR_SAMPLERS = ("BatchSampler", "CustomDistributedBatchSampler", "CustomDistributedDynamicBatchSampler",
                   "DynamicBatchLocalShuffleSampler", "RankFullLocalShuffleBatchSampler",
                   "RankFullLocalShuffleDynamicBatchSampler")
RECIPE_SAMPLER = "LengthBucketBatchSampler"
# funasr's datasets whose __getitem__ skips (--feats-type raw); +1: SenseVoiceDataset counts a language id.
RAW_SENSEVOICE = {"SenseVoiceCTCDataset": 0, "SenseVoiceDataset": 1}
MAX_TARGET_TOKENS = 200  # hard-coded in those datasets
# reason -> the option that changes it, and whether a larger (max) or smaller (min) value keeps more
OPTIONS = {"min_source_length": ("++dataset_conf.min_source_length", min),
           "max_source_length": ("++dataset_conf.max_source_length", max),
           "min_target_length": ("++dataset_conf.min_target_length", min),
           "max_target_length": ("++dataset_conf.max_target_length", max),
           "max_token_length": ("++dataset_conf.max_token_length", max),
           "sampler_max_token_length": ("++dataset_conf.max_token_length", max),
           "frames_over_batch_size": ("++dataset_conf.batch_size", max)}


@dataclass(frozen=True)
class Skip:
    """One rule that leaves an utterance out (an utterance over several limits has one per limit)."""

    set: str       # train or valid
    key: str
    reason: str    # the dataset_conf limit (or other rule) that drops it
    detail: str
    need: float = 0  # the limit's value that it passes (for the summary)

    def tsv(self) -> str:
        return f"{self.set}\t{self.key}\t{self.reason}\t{self.detail}\n"


def _rows(path: Path) -> Iterator[tuple[str, dict]]:
    """(file:line, object) of every line of a data.jsonl, or of every data.jsonl a list file names (the
    index reads a list file when the path ends in neither .jsonl nor .json)."""
    files = [path]
    if not path.name.endswith((".jsonl", ".json")):
        files = [Path(line.strip()) for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]
    for file in files:
        with open(file, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                try:
                    row = json.loads(line.strip())
                except json.JSONDecodeError as e:
                    raise BadInputError(f"{file}:{n}: not JSON ({e.msg}); funasr's index fails "
                                        "on it") from None
                yield f"{file}:{n}", row


def index_skip(row: dict, conf: dict) -> list[tuple[str, str, float]]:
    """(limit, detail, value that passes it) of every dataset_conf limit by which funasr's IndexDSJsonl
    leaves ``row`` out (all of them: raising one alone may not bring it back); empty when it keeps it."""
    if "source" not in row:
        return [("no_source", 'no "source" field: the index reads only lines with one', 0)]
    s, t = row.get("source_len", 1), row.get("target_len", 0)
    found = []
    bounds = (("min_source_length", s, True, 0), ("max_source_length", s, False, 2048),
              ("min_target_length", t, True, 0), ("max_target_length", t, False, 2048))
    for reason, value, low, default in bounds:
        limit = conf.get(reason, default)
        if value < limit if low else value > limit:
            field = "source_len" if "source" in reason else "target_len"
            found.append((reason, f"{field} {value} {'<' if low else '>'} {reason} {limit}", value))
    if s + t > (m := conf.get("max_token_length", 2200)):
        found.append(("max_token_length", f"source_len {s} + target_len {t} > max_token_length {m}", s + t))
    return found


def sampler_skip(row: dict, conf: dict) -> tuple[str, str, float] | None:
    """(reason, detail, value that keeps it) when the batch sampler leaves an indexed ``row`` out."""
    name = conf.get("batch_sampler", "BatchSampler")
    s = row.get("source_len", 1)
    if name == RECIPE_SAMPLER or (name in FUNASR_SAMPLERS and conf.get("batch_type", "example") == "example"):
        limit, scale = conf.get("max_token_length"), 1.0
        if name != RECIPE_SAMPLER:
            scale = conf.get("length_scale_source", 1.0)
        if limit is None or s / scale <= limit:
            return None
        scaled = f" / length_scale_source {scale}" if scale != 1.0 else ""
        return ("sampler_max_token_length", f"source_len {s}{scaled} > max_token_length {limit} ({name})",
                math.ceil(s / scale))
    if name in FUNASR_SAMPLERS:
        limit = conf.get("max_token_length", 2048)
        if s > limit:
            return "sampler_max_token_length", f"source_len {s} > max_token_length {limit} ({name})", s
    return None


def frontend_frames(samples: int, rate: int, frontend_conf: dict) -> int:
    """Frames of WavFrontend's output for a recording of ``samples`` at ``rate`` Hz: funasr resamples to
    the frontend's fs (torchaudio: ceil(samples * fs / rate)), kaldi fbank frames with snip_edges, LFR."""
    fs = frontend_conf.get("fs", 16000)
    n = -(-samples * fs // rate)
    window = int(fs * frontend_conf.get("frame_length", 25) / 1000)
    shift = int(fs * frontend_conf.get("frame_shift", 10) / 1000)
    frames = 1 + (n - window) // shift if n >= window else 0
    return math.ceil(frames / frontend_conf.get("lfr_n", 1))


def _audio_frames(row: dict, frontend_conf: dict, limit: int) -> tuple[int, bool]:
    """(frontend frames, exact) of a raw-audio row: from source_len (stage 0's duration in 10 ms, cut
    down: the true length lies in [source_len, source_len + 1)), and where that range straddles ``limit``
    from the recording's header."""
    fs, s = frontend_conf.get("fs", 16000), int(row.get("source_len", 1))
    low = frontend_frames(s * fs // 100, fs, frontend_conf)
    high = frontend_frames((s + 1) * fs // 100 - 1, fs, frontend_conf)
    if low > limit or high <= limit:
        return low, low == high
    try:
        import soundfile

        info = soundfile.info(row["source"])
        return frontend_frames(info.frames, info.samplerate, frontend_conf), True
    except Exception:  # a URL, a pipe, a format soundfile cannot read: the estimate stands
        return high, False


class _RawChecks:
    """funasr's SenseVoice datasets' own skips (raw audio only): frames over batch_size, >200 tokens."""

    def __init__(self, cfg: dict, tokenizer: Any = None) -> None:
        self.extra = RAW_SENSEVOICE.get(cfg.get("dataset", "AudioDataset"))
        self.batch_size = (cfg.get("dataset_conf") or {}).get("batch_size")
        self.frontend_conf = cfg.get("frontend_conf") or {}
        self.tokenizer = tokenizer
        if self.extra is not None and tokenizer is None:
            try:
                from funasr.register import tables

                tokenizer_class = tables.tokenizer_classes.get(cfg["tokenizer"])
                self.tokenizer = tokenizer_class(**cfg.get("tokenizer_conf", {}))
            except Exception as e:  # whatever a tokenizer class raises: only this check is lost
                log.warning("cannot build the tokenizer (%s): utterances over %d tokens are not predicted",
                            e, MAX_TARGET_TOKENS)

    def skip(self, row: dict) -> tuple[str, str, float] | None:
        if self.extra is None:
            return None
        if self.batch_size is not None:
            frames, exact = _audio_frames(row, self.frontend_conf, self.batch_size)
            if frames > self.batch_size:
                return ("frames_over_batch_size", f"{'' if exact else 'about '}{frames} frontend frames > "
                        f"batch_size {self.batch_size}; the dataset replaces it by a random other utterance",
                        frames)
        if self.tokenizer is not None:
            tokens = len(self.tokenizer.encode(row.get("target", ""), allowed_special="all")) + self.extra
            if tokens > MAX_TARGET_TOKENS:
                return "target_tokens", f"{tokens} target tokens > {MAX_TARGET_TOKENS} (funasr's limit)", 0
        return None


def find_skips(cfg: dict, tokenizer: Any = None) -> tuple[list[Skip], dict[str, int]]:
    """Every utterance of the train and valid lists stage 2 leaves out, and each set's line count.
    ``tokenizer``: the one funasr's dataset encodes transcripts with (raw SenseVoice; default: built from
    the config)."""
    conf = cfg.get("dataset_conf") or {}
    if conf.get("index_ds") not in INDEX_CLASSES:
        log.warning("dataset_conf.index_ds %s: its filters are not known here; %s lists nothing",
                    conf.get("index_ds"), FILE)
        return [], {}
    if conf.get("dataloader", "DataloaderMapStyle") != "DataloaderMapStyle":
        log.warning("dataset_conf.dataloader %s: its filters are not known here; %s lists only the "
                    "index's and the sampler's", conf.get("dataloader"), FILE)
    if conf.get("batch_sampler", "BatchSampler") not in (RECIPE_SAMPLER, *FUNASR_SAMPLERS):
        log.warning("dataset_conf.batch_sampler %s: its filters are not known here; %s lists only the "
                    "index's", conf.get("batch_sampler"), FILE)
    raw = _RawChecks(cfg, tokenizer)
    skips: list[Skip] = []
    totals: dict[str, int] = {}
    for name, key in (("train", "train_data_set_list"), ("valid", "valid_data_set_list")):
        totals[name] = 0
        for where, row in _rows(Path(cfg[key])):
            totals[name] += 1
            found = index_skip(row, conf) or [x for x in (sampler_skip(row, conf) or raw.skip(row),) if x]
            utt = str(row.get("key", where))
            skips += [Skip(name, utt, reason, detail, need) for reason, detail, need in found]
    return skips, totals


def summary(skips: list[Skip]) -> str:
    """Per rule: how many utterances it leaves out, and the option value each of them passes."""
    parts = []
    for reason in sorted({s.reason for s in skips}):
        mine = [s for s in skips if s.reason == reason]
        if reason in OPTIONS:
            option, pick = OPTIONS[reason]
            parts.append(f"{len(mine)} by {reason} ({option}={pick(s.need for s in mine):g} admits them)")
        elif reason == "target_tokens":
            parts.append(f"{len(mine)} over {MAX_TARGET_TOKENS} target tokens (funasr's limit)")
        else:
            parts.append(f"{len(mine)} {reason} (fix the data)")
    return "; ".join(parts)


def write_tsv(path: Path, skips: list[Skip]) -> None:
    """The table, written whole (a reader never sees half of it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp.{path.name}")
    tmp.write_text(HEADER + "".join(s.tsv() for s in skips), encoding="utf-8")
    os.replace(tmp, path)


def check(hydra_args: list[str], strict: bool = False) -> list[Skip]:
    """Find the utterances stage 2 leaves out; global rank 0 lists them in <exp-dir>/train_skipped.tsv
    and warns with the count and the options. ``strict``: any is fatal, on every rank."""
    cfg = resolved_config(hydra_args)
    skips, totals = find_skips(cfg)
    tsv = Path(cfg["output_dir"]) / FILE
    left_out = {(s.set, s.key) for s in skips}
    counts = ", ".join(f"{name} {sum(k[0] == name for k in left_out)} of {n}" for name, n in totals.items())
    if int(os.environ.get("RANK", 0)) == 0:
        write_tsv(tsv, skips)
        if skips:
            log.warning("stage 2 leaves out %d of %d utterances (%s), listed in %s: %s", len(left_out),
                        sum(totals.values()), counts, tsv, summary(skips))
        else:
            log.info("stage 2 uses every utterance (%s); %s lists none", counts, tsv)
    if skips and strict:
        raise BadInputError(f"strict mode: {len(left_out)} utterances would be left out of training "
                            f"({counts}); see {tsv}: {summary(skips)}")
    return skips
