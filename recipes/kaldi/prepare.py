"""The user's own Kaldi data dirs -> data/<set>/, byte for byte.

Reads  either several data dirs <corpus-dir>/<set>/{wav.scp,text[,utt2spk,spk2utt,segments,utt2lang,utt2emo,
       utt2event,utt2itn]}
       (every subdirectory with a wav.scp is a set), or one data dir <corpus-dir>/{wav.scp,...};
writes <data-dir>/<set>/{the same files} and <data-dir>/corpus.json.

Several data dirs: each is copied unchanged. The train set is "train"; the valid set is the first of
dev, valid, validation, val that exists (if none does, dev speakers are held out of train as below);
every set but train is a test set. One data dir: its lines are split by speaker (utt2spk) into train
and a speaker-disjoint dev set of --dev-speakers speakers (default 5% of them, at least one), picked
deterministically: the speakers sorted by name, then evenly spaced picks (the middle one of each of
N equal runs). spk2utt lines go where their speaker goes; a line whose key has no speaker goes to
train. With one speaker or none (no utt2spk), dev is every 20th utterance instead, with a warning: it
is not speaker-disjoint. With segments (utterances that are ranges of longer recordings), wav.scp
lists recordings: both sets get all of it, and the segments lines are split with their utterances.
Either way every line keeps its bytes and its order, broken ones included (not UTF-8, duplicate keys,
empty transcripts, `cmd |` pipes): stage 0's validator (local/prepare_data.py)
reports them by file and line. spk2utt is made from utt2spk only where it is missing. Relative
wav.scp paths are kept; like Kaldi, they are read relative to the directory run.sh runs in. Lines end
at CR LF, CR or LF, and a UTF-8 byte-order mark before a file's first line (Windows editors write one)
is not part of its first key; the split keeps both as they are. A file that cannot be read fails
naming it.

  .venv/bin/python -m recipes.kaldi.prepare --corpus-dir /path/to/my_data --data-dir data --language en
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from funasr_recipe.data.corpus import CorpusInfo, write_corpus_info
from funasr_recipe.data.kaldi_table import BOM, first_field, iter_lines, open_table
from recipes.common import CorpusLayoutError, log_set
from recipes.user_data import SET_NAME, VALID_NAMES, own_corpus_info, own_main

log = logging.getLogger(__name__)

FILES = ("wav.scp", "segments", "text", "utt2spk", "spk2utt", "utt2lang", "utt2emo", "utt2event", "utt2itn")
DEV_EVERY = 20  # with fewer than two speakers: every 20th utterance (5%) is held out as dev


def _fields(path: Path) -> Iterator[list[bytes]]:
    """The whitespace-separated fields of every line of a Kaldi file, a byte-order mark left out."""
    with open_table(path) as f:
        for n, raw in enumerate(iter_lines(f), start=1):
            yield (raw[len(BOM):] if n == 1 and raw.startswith(BOM) else raw).split()


def read_utt2spk(path: Path) -> dict[bytes, bytes]:
    """utt2spk as bytes, key -> speaker; the first line of a repeated key wins; lines without a speaker
    are left out (the validator reports them)."""
    spk: dict[bytes, bytes] = {}
    for parts in _fields(path):
        if len(parts) >= 2:
            spk.setdefault(parts[0], parts[1])
    return spk


def write_spk2utt(utt2spk: Path, spk2utt: Path) -> None:
    """Make spk2utt from utt2spk (in bytes): speakers sorted, their utterances in file order."""
    groups: dict[bytes, list[bytes]] = {}
    for parts in _fields(utt2spk):
        if len(parts) >= 2:
            groups.setdefault(parts[1], []).append(parts[0])
    with open(spk2utt, "wb") as f:
        for spk in sorted(groups):
            f.write(spk + b" " + b" ".join(groups[spk]) + b"\n")


def utterance_table(set_dir: Path) -> str:
    """The table with one line per utterance: segments where there is one (wav.scp then lists recordings)."""
    return "segments" if (set_dir / "segments").is_file() else "wav.scp"


def log_counts(set_dir: Path) -> None:
    """Log the utterances (non-blank wav.scp or segments lines) and speakers (utt2spk) of a written set."""
    with open_table(set_dir / utterance_table(set_dir)) as f:
        n_utts = sum(1 for raw in iter_lines(f) if raw.strip())
    n_spk = len(set(read_utt2spk(set_dir / "utt2spk").values())) if (set_dir / "utt2spk").is_file() else 0
    log_set(set_dir, n_utts, n_spk)


def check_files(src: Path) -> None:
    """Say what a missing table means: no text is fatal for the set (the validator refuses it), no
    utt2spk only makes each utterance its own speaker."""
    if not (src / "text").is_file():
        log.warning("%s is missing: the validator will refuse this set", src / "text")
    if not (src / "utt2spk").is_file():
        log.info("%s has no utt2spk: each utterance is its own speaker", src)


def copy_file(src: Path, dst: Path) -> None:
    """shutil.copyfile, with a file this user may not read (or write) named as bad input, not a crash."""
    try:
        shutil.copyfile(src, dst)
    except PermissionError as e:
        raise CorpusLayoutError(f"{e.filename or src}: permission denied (check the mode and owner of the "
                                "file and of its directories)") from None


def copy_set(src: Path, dst: Path) -> None:
    """Copy the data dir files of src to dst unchanged; spk2utt is made only where it is missing."""
    check_files(src)
    dst.mkdir(parents=True, exist_ok=True)
    same = src.resolve() == dst.resolve()
    for name in FILES:
        if (src / name).is_file():
            if not same:
                copy_file(src / name, dst / name)
        elif not same:
            (dst / name).unlink(missing_ok=True)  # left from an earlier run
    if not (dst / "spk2utt").is_file() and (dst / "utt2spk").is_file():
        write_spk2utt(dst / "utt2spk", dst / "spk2utt")
    log_counts(dst)


def pick_dev_speakers(speakers: list[bytes], n: int | None) -> set[bytes]:
    """n speakers of the sorted list, evenly spaced (default 5% of them, at least one)."""
    speakers = sorted(set(speakers))
    n = max(1, round(0.05 * len(speakers))) if n is None else n
    if n < 1 or n >= len(speakers):
        raise CorpusLayoutError(f"cannot hold out {n} of {len(speakers)} speakers as a speaker-disjoint dev "
                                "set and keep one for training; give a dev set (<corpus-dir>/dev/) instead")
    return {speakers[(2 * i + 1) * len(speakers) // (2 * n)] for i in range(n)}


def split_set(src: Path, train: Path, dev: Path, dev_speakers: int | None) -> None:
    """Split the lines of the data dir src into train and dev by speaker, keeping each line's bytes."""
    check_files(src)
    if src.resolve() in (train.resolve(), dev.resolve()):
        raise CorpusLayoutError(f"splitting {src} into {train} and {dev} would overwrite it; give a "
                                "--data-dir outside the corpus or a separate dev set")
    utt2spk = read_utt2spk(src / "utt2spk") if (src / "utt2spk").is_file() else {}
    n_speakers = len(set(utt2spk.values()))
    if n_speakers >= 2:
        held_out = pick_dev_speakers(list(utt2spk.values()), dev_speakers)
        log.info("%s: dev speakers (held out of train): %s", src,
                 " ".join(s.decode("utf-8", "backslashreplace") for s in sorted(held_out)))
    elif dev_speakers is not None:
        raise CorpusLayoutError(f"--dev-speakers {dev_speakers}: {src} has {n_speakers} speaker(s) to hold "
                                "out; give a dev set instead")
    else:  # no speakers to hold out: utterances, each routed as its own "speaker" below
        keys = sorted({parts[0] for parts in _fields(src / utterance_table(src)) if parts})
        if len(keys) < 2:
            raise CorpusLayoutError(f"cannot hold out a dev set from {len(keys)} utterance(s) of {src} and "
                                    "keep one for training; give a dev set (<corpus-dir>/dev/) instead")
        held_out = set(keys[DEV_EVERY // 2::DEV_EVERY] or keys[-1:])
        utt2spk = {k: k for k in keys}
        log.warning("%s: %d speaker(s) for %d utterances: dev is every %dth utterance (%d), not speaker-"
                    "disjoint, so its scores are optimistic for new voices; give a dev set for a fair one",
                    src, n_speakers, len(keys), DEV_EVERY, len(held_out))
    segmented = (src / "segments").is_file()
    for d in (train, dev):
        d.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        if not (src / name).is_file():
            for d in (train, dev):
                (d / name).unlink(missing_ok=True)  # left from an earlier run
            continue
        with (open_table(src / name) as f, open(train / name, "wb") as to_train,
              open(dev / name, "wb") as to_dev):
            ends = {to_train: True, to_dev: True}  # did the last line written end with a line end?
            for lineno, raw in enumerate(iter_lines(f), start=1):
                key = first_field(raw, lineno)  # the utterance (or, in spk2utt, the speaker)
                spk = key if name == "spk2utt" else utt2spk.get(key) if key is not None else None
                # With segments, wav.scp lines are recordings, which utterances of both sets may share.
                outs: tuple[BinaryIO, ...] = ((to_train, to_dev) if segmented and name == "wav.scp" else
                                              (to_dev,) if spk in held_out else (to_train,))
                for out in outs:
                    if not ends[out]:
                        out.write(b"\n")  # a last line without newline is no longer last: end it
                    out.write(raw)
                    ends[out] = raw.endswith((b"\n", b"\r"))
    for d in (train, dev):
        if not (d / "spk2utt").is_file() and (d / "utt2spk").is_file():
            write_spk2utt(d / "utt2spk", d / "spk2utt")
        log_counts(d)


def find_sets(corpus_dir: Path) -> dict[str, Path]:
    """{set name: data dir} for every subdirectory of corpus_dir that holds a wav.scp."""
    if not corpus_dir.is_dir():
        raise CorpusLayoutError(f"expected a directory of Kaldi data dirs or one data dir at {corpus_dir}")
    sets = {d.name: d for d in sorted(corpus_dir.iterdir()) if (d / "wav.scp").is_file()}
    if not sets:
        raise CorpusLayoutError(f"expected {corpus_dir / 'wav.scp'} (one data dir) or "
                                f"{corpus_dir / 'train' / 'wav.scp'} and more sets beside it; found neither")
    if bad := [name for name in sets if not SET_NAME.match(name)]:
        raise CorpusLayoutError(f"set names {bad} in {corpus_dir}: use letters, digits and _.+- only "
                                "(a set name becomes a directory name and a shell word)")
    return sets


def prepare(corpus_dir: Path, data_dir: Path, dev_speakers: int | None = None, **tags: str) -> CorpusInfo:
    """Copy (several data dirs) or split (one data dir) the user's Kaldi data into data_dir."""
    if (corpus_dir / "wav.scp").is_file():
        split_set(corpus_dir, data_dir / "train", data_dir / "dev", dev_speakers)
        sets, valid = ["train", "dev"], "dev"
    else:
        found = find_sets(corpus_dir)
        if "train" not in found:
            raise CorpusLayoutError(f"expected a train set {corpus_dir / 'train' / 'wav.scp'}; "
                                    f"found the sets {sorted(found)}")
        valid = next((name for name in VALID_NAMES if name in found), None)
        if valid is None:
            log.info("%s has none of the sets %s: holding out dev speakers of train", corpus_dir, VALID_NAMES)
            split_set(found.pop("train"), data_dir / "train", data_dir / "dev", dev_speakers)
            valid = "dev"
        elif dev_speakers is not None:
            log.warning("--dev-speakers %d is ignored: %s is the dev set", dev_speakers, found[valid])
        for name, src in found.items():
            copy_set(src, data_dir / name)
        sets = sorted({*found, "train", valid})
    info = own_corpus_info("kaldi", corpus_dir, sets, valid, **tags)
    write_corpus_info(data_dir, info)
    return info


def main() -> None:
    """Command line entry point."""
    own_main(prepare, __doc__, "without their own (utt2lang, utt2emo, utt2event)")


if __name__ == "__main__":
    main()
