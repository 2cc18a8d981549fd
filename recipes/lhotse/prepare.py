"""lhotse manifests -> Kaldi data dirs, one utterance per supervision.

Reads  <corpus-dir>/<name>_cuts_<split>.jsonl[.gz] (a CutSet), or <corpus-dir>/<name>_recordings_<split>
       .jsonl[.gz] with <name>_supervisions_<split>.jsonl[.gz] (a RecordingSet and its SupervisionSet), as
       lhotse's own recipes (`lhotse prepare ...`) name them; one <name> per directory;
writes <data-dir>/<set>/{wav.scp,text,utt2spk,spk2utt[,utt2lang,segments]} and <data-dir>/corpus.json.

The manifests are read with lhotse itself, lazily: cuts and supervisions stream one at a time; only a
split's recordings are indexed by id (supervisions may come in any order). A split that has both forms
is read from its cuts. Each supervision is one utterance: key = supervision id, text as given (none: an
empty transcript, which the validator rejects), speaker (none: the key), language as given (utt2lang;
the validator maps names and codes such as English or en-US to SenseVoice tags), and its time range in
the recording: supervision start (in a cut, cut.start + supervision start: lhotse keeps a cut's
supervision times relative to the cut) to start + duration, written to segments with wav.scp keyed by
recording id. A set whose utterances all are whole recordings is written without segments; in a set
with segments every utterance has its explicit range (lhotse's Kaldi reader takes only a literal -1 as
"to the end"). Nothing is dropped: a supervision seen again in another cut with the same range and
text (overlapping cuts: trim_to_supervisions(keep_overlapping=True)) is the same utterance, written
once and counted in the log; a repeat that differs is kept, so the validator rejects the duplicate key.

Audio is the recording's AudioSource: type "file" is its path (lhotse opens a relative path as given,
i.e. relative to the working directory of the reading process, so it is made absolute against the
directory this runs in, run.sh's; lhotse's RecordingSet.with_path_prefix roots it elsewhere), type
"command" a Kaldi pipe `cmd |` (the validator wants --allow-pipes true); "url", "memory" and "shar"
sources stop with a CorpusLayoutError naming the recording. Stage 1 downmixes a multi-channel file, so
a supervision is a file's audio only where that is the supervision's: a mono recording, a supervision
over all channels of a one-file recording, or one over the channels of one of the recording's files
(one file per channel); a supervision on some channels of a multi-channel file cannot be selected
today and stops the recipe naming it. So do recordings with transforms other than resampling (speed or
volume perturbation: the file is not the audio lhotse means; stage 1 speed-perturbs by itself), mixed
or padded cuts, cuts without a recording and supervisions of a recording the split does not have.

Sets: every split named train or train<anything> (train-clean-100, ...) is merged into "train"; the
dev set is the first of dev, valid, validation, val, else the first split whose name starts with
"dev" (LibriSpeech's dev-clean), else --dev-speakers speakers held out of train (recipes/common.py
hold_out_dev). Every set but train is decoded as a test set. A split's name becomes its set's name,
characters other than letters, digits and _.+- replaced by "_".

  .venv/bin/python -m recipes.lhotse.prepare --corpus-dir data/manifests --data-dir data --language en
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lhotse import Recording, RecordingSet, SupervisionSegment, SupervisionSet, load_manifest_lazy
from lhotse.audio import AudioSource
from lhotse.cut import CutSet, MixedCut
from lhotse.cut.data import DataCut

from funasr_recipe.data.corpus import CorpusInfo
from recipes.common import CorpusLayoutError, Utt
from recipes.user_data import (
    listing,
    own_main,
    set_names,
    write_own_sets,
)

log = logging.getLogger(__name__)

MANIFEST = re.compile(r"^(?P<name>.+?)_(?P<kind>cuts|recordings|supervisions)_(?P<split>.+?)"
                      r"\.jsonl(?:\.gz)?$")
SOURCE_HINTS = {"url": "download the audio and point the manifest at the files",
                "shar": "export the Shar back to manifests over audio files"}


@dataclass
class LhotseUtt(Utt):
    """An utterance with whether it spans its whole recording (then it needs no segments line)."""

    whole: bool = False


@dataclass
class Split:
    """The manifests of one split: its cuts, or its recordings and supervisions."""

    cuts: Path | None = None
    recordings: Path | None = None
    supervisions: Path | None = None


def find_splits(corpus_dir: Path) -> dict[str, Split]:
    """{split: its manifests} of the lhotse manifests in corpus_dir, named as lhotse's recipes name them."""
    if not corpus_dir.is_dir():
        raise CorpusLayoutError(f"expected a directory of lhotse manifests at {corpus_dir}")
    files = sorted(p.name for p in corpus_dir.iterdir())
    corpora: set[str] = set()
    splits: dict[str, Split] = {}
    for name in files:
        if (m := MANIFEST.match(name)) is None or not (corpus_dir / name).is_file():
            continue
        corpora.add(m["name"])
        split = splits.setdefault(m["split"], Split())
        if (other := getattr(split, m["kind"])) is not None:
            raise CorpusLayoutError(f"{corpus_dir}: two {m['kind']} manifests of split {m['split']!r}, "
                                    f"{other.name} and {name}; keep one")
        setattr(split, m["kind"], corpus_dir / name)
    if not splits:
        raise CorpusLayoutError(f"no lhotse manifest in {corpus_dir}: expected <name>_cuts_<split>.jsonl.gz, "
                                "or <name>_recordings_<split>.jsonl.gz with <name>_supervisions_<split>"
                                f".jsonl.gz (.jsonl too); found {listing(files)}")
    if len(corpora) > 1:
        raise CorpusLayoutError(f"{corpus_dir} holds the manifests of several corpora "
                                f"({' '.join(sorted(corpora))}); give a directory with one")
    for name, split in splits.items():
        if split.cuts is not None:
            if split.recordings or split.supervisions:
                log.warning("split %s: reading its cuts %s; its recordings/supervisions are not read",
                            name, split.cuts.name)
        elif split.recordings is None or split.supervisions is None:
            has, lacks = (split.recordings, "supervisions") if split.recordings else (split.supervisions,
                                                                                     "recordings")
            raise CorpusLayoutError(f"{corpus_dir}: split {name!r} has {has.name} but no {lacks} "
                                    f"manifest (<name>_{lacks}_{name}.jsonl.gz) and no cuts; found "
                                    f"{listing(files)}")
    return splits


def read_manifest(path: Path, kind: type) -> Iterator[Any]:
    """The items of a lhotse manifest, read lazily; a file lhotse cannot read, or that holds another
    kind of manifest than its name says, is a CorpusLayoutError naming it."""
    try:
        manifest = load_manifest_lazy(path)
    except (ValueError, KeyError, TypeError, OSError, EOFError) as e:  # lhotse passes on json/gzip errors
        raise CorpusLayoutError(f"{path}: lhotse cannot read it ({type(e).__name__}: {e})") from None
    if manifest is None:
        log.warning("%s is empty", path)
        return
    if not isinstance(manifest, kind):
        raise CorpusLayoutError(f"{path}: a {type(manifest).__name__} manifest, but its name says "
                                f"{kind.__name__}")
    items, n = iter(manifest), 0
    while True:
        try:
            item = next(items)
        except StopIteration:
            return
        except (ValueError, KeyError, TypeError, OSError, EOFError) as e:
            raise CorpusLayoutError(f"{path}: item {n + 1} cannot be read by lhotse ({type(e).__name__}: "
                                    f"{e})") from None
        n += 1
        yield item


def source_path(rec: Recording, source: AudioSource) -> str:
    """The wav.scp entry of a recording's audio source: an absolute path or a Kaldi pipe."""
    if source.type == "file":
        return os.path.abspath(source.source)  # relative to the cwd, as lhotse itself opens it
    if source.type == "command":
        return f"{source.source} |"
    hint = SOURCE_HINTS.get(source.type, "write the audio to files first")
    raise CorpusLayoutError(f"recording {rec.id}: an audio source of type {source.type!r} is not supported, "
                            f"only 'file' and 'command' ones: {hint}")


def audio_path(rec: Recording, sup: SupervisionSegment) -> str:
    """The file (or pipe) whose audio is the supervision's, once stage 1 has downmixed it."""
    altered = [t["name"] if isinstance(t, dict) else type(t).__name__ for t in rec.transforms or []]
    if altered := [name for name in altered if name != "Resample"]:  # stage 1 resamples anyway
        raise CorpusLayoutError(f"recording {rec.id} has the transforms {altered}: its file is not the audio "
                                "lhotse means; prepare from the manifests before perturbation (stage 1 "
                                "speed-perturbs by itself)")
    channels = sorted([sup.channel] if isinstance(sup.channel, int) else sup.channel)
    if rec.num_channels == 1 or (len(rec.sources) == 1 and channels == sorted(rec.channel_ids)):
        return source_path(rec, rec.sources[0])
    source = next((s for s in rec.sources if sorted(s.channels) == channels), None)
    if source is None:
        raise CorpusLayoutError(f"supervision {sup.id} is on channel(s) {channels} of the {rec.num_channels}-"
                                f"channel recording {rec.id}: one channel of a multi-channel file cannot be "
                                "selected (stage 1 downmixes all); give each channel its own file (an "
                                "AudioSource per channel) or the supervision all channels")
    return source_path(rec, source)


def utterance(sup: SupervisionSegment, rec: Recording, offset: float = 0.0) -> LhotseUtt:
    """The utterance of a supervision of ``rec`` whose start is ``offset`` seconds into the recording
    plus its own (in a cut, supervision times are relative to the cut's start)."""
    start = offset + sup.start
    end = start + sup.duration
    return LhotseUtt(key=sup.id, path=audio_path(rec, sup), text="" if sup.text is None else sup.text,
                     speaker=sup.speaker or sup.id, language=sup.language, start=start, end=end,
                     recording=rec.id, whole=round(start, 3) == 0 and round(end, 3) == round(rec.duration, 3))


def cut_utterances(path: Path) -> Iterator[LhotseUtt]:
    """One utterance per distinct supervision of the cuts of a CutSet manifest."""
    seen: dict[str, tuple] = {}
    repeats = without = 0
    for cut in read_manifest(path, CutSet):
        if isinstance(cut, MixedCut):
            raise CorpusLayoutError(f"{path}: cut {cut.id} is a MixedCut (a mix or a padded cut), not a "
                                    "range of one recording; write the cuts before mixing or padding")
        if not cut.supervisions:
            without += 1  # padding, or audio without transcript: no utterance to write
            continue
        if not isinstance(cut, DataCut) or not cut.has_recording:
            raise CorpusLayoutError(f"{path}: cut {cut.id} has no recording (features only?): the recipe "
                                    "needs the audio")
        for sup in cut.supervisions:
            utt = utterance(sup, cut.recording, cut.start)
            same = (utt.path, utt.recording, round(utt.start, 3), round(utt.end, 3), utt.text, utt.speaker,
                    utt.language)
            if seen.get(utt.key) == same:
                repeats += 1
                continue
            if utt.key in seen:
                log.warning("%s: supervision %s occurs in several cuts with different ranges or text; each "
                            "is kept, and the validator rejects the duplicate key", path, utt.key)
            seen.setdefault(utt.key, same)
            yield utt
    if repeats:
        log.info("%s: %d supervisions repeated in overlapping cuts (same range and text) were taken once",
                 path, repeats)
    if without:
        log.warning("%s: %d cuts have no supervision, so no transcript: not utterances", path, without)


def supervision_utterances(recordings_path: Path, supervisions_path: Path) -> Iterator[LhotseUtt]:
    """One utterance per supervision of a SupervisionSet, with its recording from the RecordingSet."""
    recordings: dict[str, Recording] = {}
    for rec in read_manifest(recordings_path, RecordingSet):
        if rec.id in recordings:
            raise CorpusLayoutError(f"{recordings_path}: recording {rec.id} is listed twice")
        recordings[rec.id] = rec
    used: set[str] = set()
    missing: list[str] = []
    for sup in read_manifest(supervisions_path, SupervisionSet):
        rec = recordings.get(sup.recording_id)
        if rec is None:
            missing.append(f"{sup.id} ({sup.recording_id})")
            continue
        used.add(rec.id)
        yield utterance(sup, rec)
    if missing:
        raise CorpusLayoutError(f"{supervisions_path}: {len(missing)} supervisions are of recordings that "
                                f"{recordings_path.name} does not have: {listing(missing, 5)}")
    if unused := len(recordings) - len(used):
        log.warning("%s: %d recordings have no supervision, so no transcript: not utterances",
                    recordings_path, unused)


def read_split(name: str, split: Split) -> list[LhotseUtt]:
    """The utterances of one split, in manifest order."""
    if split.cuts is not None:
        utts = list(cut_utterances(split.cuts))
    else:
        assert split.recordings is not None and split.supervisions is not None  # find_splits checked
        utts = list(supervision_utterances(split.recordings, split.supervisions))
    log.info("split %s: %d utterances", name, len(utts))
    return utts


def settle_ranges(utts: list[Utt]) -> None:
    """Whole-recording utterances only: no ranges (no segments file); else every one keeps its range."""
    if all(isinstance(u, LhotseUtt) and u.whole for u in utts):
        for u in utts:
            u.start = u.end = None


def prepare(corpus_dir: Path, data_dir: Path, dev_speakers: int | None = None, **tags: str) -> CorpusInfo:
    """Write one Kaldi data dir per set of the lhotse manifests in corpus_dir, and corpus.json."""
    splits = find_splits(corpus_dir)
    names = set_names(splits)
    train = sorted(n for n in names.values() if n.lower().startswith("train"))
    if not train:
        raise CorpusLayoutError(f"{corpus_dir}: no train split (named train or train<anything>); the splits "
                                f"are {listing(sorted(splits))}")
    if len(train) > 1:
        log.info("train: the splits %s together", " ".join(train))
    sets: dict[str, list[Utt]] = {"train": []}
    for split, manifests in splits.items():
        utts = read_split(split, manifests)
        if names[split] in train:
            sets["train"].extend(utts)
        else:
            sets[names[split]] = list(utts)
    return write_own_sets("lhotse", corpus_dir, data_dir, sets, dev_speakers, dev_prefix=True,
                          each_set=settle_ranges, **tags)


def main() -> None:
    """Command line entry point."""
    own_main(prepare, __doc__, "whose supervision has none")


if __name__ == "__main__":
    main()
