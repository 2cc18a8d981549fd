"""Shared helpers of the corpus recipes: write Kaldi data dirs and the corpus description.

Every recipe (``recipes/<corpus>/prepare.py``) turns one corpus in its upstream layout into
``data/<set>/{wav.scp,text,utt2spk,spk2utt[,utt2lang,utt2emo,utt2event]}`` and ``data/corpus.json``.
Validation is not done here: stage 0's ``local.prepare_data`` checks every line afterwards, so a recipe
copies what the corpus says and never drops or repairs an utterance on its own.

  .venv/bin/python -m recipes.fsdd.prepare --corpus-dir corpora/free-spoken-digit-dataset --data-dir data
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from funasr_recipe.core.cli import EXIT_CODES_HELP, EXIT_OK, run_main
from funasr_recipe.core.log import setup_logging
from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.data import kaldi_table
from funasr_recipe.data.corpus import CorpusInfo, write_corpus_info


@dataclass
class Utt:
    """One utterance as a recipe found it. ``path`` is absolute (or a ``cmd |`` pipe)."""

    key: str
    path: str
    text: str
    speaker: str
    language: str | None = None  # written to utt2lang when any utterance of the set has one
    emotion: str | None = None  # utt2emo
    event: str | None = None  # utt2event
    itn: str | None = None  # utt2itn: withitn/woitn of this utterance (else the corpus's --itn)
    # A range of a longer recording, in seconds (both or neither): the set is written with a segments
    # file, wav.scp then keyed by recording (``recording``, default the path's own key).
    start: float | None = None
    end: float | None = None
    recording: str | None = None


def write_kaldi_set(set_dir: Path, utts: Iterable[Utt]) -> int:
    """Write one Kaldi data dir, sorted by key; returns the number of utterances.

    Writes set_dir/{wav.scp,text,utt2spk,spk2utt} and utt2lang/utt2emo/utt2event/utt2itn for the tags
    that any utterance carries. When any utterance is a range of a recording, wav.scp lists recordings
    and ``segments`` maps each utterance to ``<recording> <start> <end>`` (an utterance that is a whole
    file gets end -1, Kaldi's "to the end"). Keys must already be unique and start with the speaker id
    (Kaldi's rule, so that sorting by key also groups speakers).
    """
    utts = sorted(utts, key=lambda u: u.key)
    set_dir.mkdir(parents=True, exist_ok=True)
    columns = {"wav.scp": "path", "text": "text", "utt2spk": "speaker", "utt2lang": "language",
               "utt2emo": "emotion", "utt2event": "event", "utt2itn": "itn"}
    segmented = any(u.start is not None for u in utts)
    for name, attr in columns.items():
        values = [(u.key, getattr(u, attr)) for u in utts]
        if name.startswith("utt2") and name != "utt2spk" and all(v is None for _, v in values):
            (set_dir / name).unlink(missing_ok=True)
            continue
        if name == "wav.scp" and segmented:
            values = sorted({(u.recording or u.key, u.path) for u in utts})
        if name == "text":  # a line break inside a CSV field or a supervision would end the line
            values = [(key, " ".join(text.split())) for key, text in values]
        with open(set_dir / name, "w", encoding="utf-8") as f:
            for key, value in values:
                f.write(f"{key} {'' if value is None else value}\n")
    if segmented:
        with open(set_dir / "segments", "w", encoding="utf-8") as f:
            for u in utts:
                start, end = (0.0, -1.0) if u.start is None or u.end is None else (u.start, u.end)
                f.write(f"{u.key} {u.recording or u.key} {start:.3f} {end:.3f}\n")
    else:
        (set_dir / "segments").unlink(missing_ok=True)
    spk2utt: dict[str, list[str]] = {}
    for u in utts:
        spk2utt.setdefault(u.speaker, []).append(u.key)
    with open(set_dir / "spk2utt", "w", encoding="utf-8") as f:
        for spk in sorted(spk2utt):
            f.write(f"{spk} {' '.join(spk2utt[spk])}\n")
    return len(utts)


# ---------------------------------------------------------------------------------------------------
# Helpers shared by the recipes' programs: layout checks, speaker splits, logging of what went where.

log = logging.getLogger(__name__)


class CorpusLayoutError(BadInputError):
    """The corpus directory does not have the layout a recipe expects (wrong --corpus-dir?)."""


def require(path: Path, what: str) -> Path:
    """Return ``path`` if it exists, else raise CorpusLayoutError naming the expected path."""
    if not path.exists():
        raise CorpusLayoutError(f"expected {what} at {path}, but it does not exist "
                                f"(is --corpus-dir the corpus in its upstream layout?)")
    return path


def split_list(value: str) -> list[str]:
    """Split an option value given as ``"a b"`` or ``"a,b"`` into its non-empty items, in order."""
    return [item for item in re.split(r"[\s,]+", value) if item]


def resolve_audio(entry: str, root: Path) -> str:
    """Absolute form of a wav.scp value: a ``cmd |`` pipe or an absolute path is kept, a relative
    path is resolved against ``root`` (the way the corpus's own data prep prefixes its directory)."""
    if entry.rstrip().endswith("|") or Path(entry).is_absolute():
        return entry
    return str(root.resolve() / entry)


def read_table(path: Path) -> list[tuple[str, str]]:
    """``(key, value)`` of every non-blank line of a UTF-8 Kaldi table, in file order (duplicates kept).

    A public corpus's tables are UTF-8; a line that is not means a wrong file, named with its line.
    """
    try:
        return kaldi_table.read_table(path)
    except kaldi_table.TableError as e:
        raise CorpusLayoutError(str(e)) from None


def read_kaldi_dir(src: Path, root: Path) -> list[Utt]:
    """Utterances of a public corpus's Kaldi dir ``src/{wav.scp,text,utt2spk}``, one per wav.scp line.

    Relative audio paths are resolved against ``root``. Nothing is dropped: a key without text gets an
    empty transcript and a key without utt2spk entry is its own speaker (both logged), so that the
    validator reports them.
    """
    for name in ("wav.scp", "text", "utt2spk"):
        require(src / name, f"the Kaldi file {name}")
    wavs = read_table(src / "wav.scp")
    text, spk = dict(read_table(src / "text")), dict(read_table(src / "utt2spk"))
    utts = [Utt(key, resolve_audio(path, root), text.get(key, ""), spk.get(key, key)) for key, path in wavs]
    keys = {key for key, _ in wavs}
    for what, missing in (("no text", keys - text.keys()), ("no utt2spk entry", keys - spk.keys()),
                          ("text but no wav.scp entry", text.keys() - keys)):
        if missing:
            log.warning("%s: %d keys have %s, e.g. %s", src, len(missing), what, sorted(missing)[:5])
    return utts


def split_by_speakers(utts: list[Utt], dev_speakers: Iterable[str],
                      role: str = "dev") -> tuple[list[Utt], list[Utt]]:
    """Split utterances into (rest, held out): held out holds every utterance of ``dev_speakers``.

    Raises CorpusLayoutError when a held-out speaker does not occur (the message calls them ``role``
    speakers) or when no training speaker is left.
    """
    dev_speakers = set(dev_speakers)
    speakers = {u.speaker for u in utts}
    if unknown := sorted(dev_speakers - speakers):
        raise CorpusLayoutError(f"{role} speakers {unknown} are not in the corpus; its speakers are "
                                f"{sorted(speakers)[:20]}{' ...' if len(speakers) > 20 else ''}")
    if not speakers - dev_speakers:
        raise CorpusLayoutError(f"no training speaker is left after holding out {sorted(dev_speakers)}")
    train = [u for u in utts if u.speaker not in dev_speakers]
    return train, [u for u in utts if u.speaker in dev_speakers]


def hold_out_dev(utts: list[Utt], n_speakers: int | None = None,
                 fraction: float = 0.05) -> tuple[list[Utt], list[Utt]]:
    """(train, dev) of a corpus that brings no dev set: n_speakers held out (default ``fraction`` of
    them, at least one), evenly spaced in name order; with fewer than two speakers (or none given:
    every utterance its own speaker is no speaker), every 1/fraction-th utterance in key order instead,
    with a warning that dev then shares the training speakers."""
    speakers = sorted({u.speaker for u in utts})
    if len(speakers) >= 2 and len(speakers) < len(utts):
        n = max(1, round(fraction * len(speakers))) if n_speakers is None else n_speakers
        if not 1 <= n < len(speakers):
            raise CorpusLayoutError(f"cannot hold out {n} of {len(speakers)} speakers as a speaker-disjoint "
                                    "dev set and keep one for training; give a dev set instead")
        held = {speakers[(2 * i + 1) * len(speakers) // (2 * n)] for i in range(n)}
        log.info("dev speakers (held out of train): %s", " ".join(sorted(held)))
        return split_by_speakers(utts, held)
    if len(utts) < 2:
        raise CorpusLayoutError(f"cannot hold out a dev set from {len(utts)} utterance(s); give a dev set")
    step = max(2, round(1 / fraction))
    ordered = sorted(utts, key=lambda u: u.key)
    dev = ordered[step // 2::step] or ordered[-1:]
    picked = {u.key for u in dev}
    log.warning("%d speaker(s) for %d utterances: dev is every %dth utterance (%d), not speaker-disjoint, so "
                "its scores are optimistic for new voices; give a dev set for a fair one", len(speakers),
                len(utts), step, len(dev))
    return [u for u in ordered if u.key not in picked], dev


def log_set(set_dir: Path, n_utts: int, n_speakers: int) -> None:
    """Log how many utterances and speakers went to one set."""
    log.info("%s: %d utterances, %d speakers", set_dir, n_utts, n_speakers)


def write_sets(data_dir: Path, sets: dict[str, list[Utt]], info: CorpusInfo) -> CorpusInfo:
    """write_kaldi_set for every ``{set name: utterances}`` under data_dir (logging each set's size),
    then data_dir/corpus.json; returns info. This is the whole output of a recipe."""
    for name, utts in sets.items():
        n = write_kaldi_set(data_dir / name, utts)
        log_set(data_dir / name, n, len({u.speaker for u in utts}))
    write_corpus_info(data_dir, info)
    return info


def recipe_parser(doc: str | None, default_corpus_dir: Path | None = None,
                  dev_speakers: str | None = None, parts: str | None = None) -> argparse.ArgumentParser:
    """Argument parser with the options every recipe has: --corpus-dir and --data-dir, and
    --dev-speakers (a speaker list) for the recipes that hold out speakers, --parts for those that
    prepare named parts of a corpus, each given its default."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=EXIT_CODES_HELP)
    parser.add_argument("--corpus-dir", type=Path, default=default_corpus_dir,
                        required=default_corpus_dir is None, help="the corpus in its upstream layout"
                        + (" (default: %(default)s)" if default_corpus_dir else ""))
    parser.add_argument("--data-dir", type=Path, default=Path("data"),
                        help="where data/<set>/ and corpus.json are written (default: %(default)s)")
    if dev_speakers is not None:
        parser.add_argument("--dev-speakers", default=dev_speakers, help="held-out speakers, comma "
                            "separated; all others train (default: %(default)s)")
    if parts is not None:
        parser.add_argument("--parts", default=parts, help="parts of the corpus to prepare where present, "
                            'space or comma separated, e.g. "train test" (default: %(default)s)')
    return parser


def run_recipe(prepare: Callable[..., CorpusInfo], **kwargs: Any) -> CorpusInfo:
    """Call a recipe's ``prepare(**kwargs)`` from its ``main()``: set up logging, turn a layout error
    into a one-line message and exit status 2 (bad input: core/cli.py), and log what corpus.json says."""
    setup_logging()
    result: list[CorpusInfo] = []
    rc = run_main(lambda: result.append(prepare(**kwargs)), log)
    if rc != EXIT_OK:
        sys.exit(rc)
    info = result[0]
    log.info("%s: train_set=%s valid_set=%s test_sets=%s language=%s", kwargs.get("data_dir", ""),
             info.train_set, info.valid_set, " ".join(info.test_sets), info.language)
    return info
