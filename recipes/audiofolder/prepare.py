"""A folder of audio with a metadata file (Hugging Face's audiofolder, or LJSpeech) -> Kaldi data dirs.

Reads  <corpus-dir>/<split>/metadata.{csv,jsonl} beside the split's audio (one folder per split), or one
       <corpus-dir>/metadata.{csv,jsonl} for the whole folder; an LJSpeech-style metadata.csv
       (`id|text|normalized text`, no header, audio in wavs/<id>.wav) too;
writes <data-dir>/<set>/{wav.scp,text,utt2spk,spk2utt[,utt2lang]} and <data-dir>/corpus.json.

audiofolder: the metadata has a header; file_name is the audio's path relative to the metadata
file, the transcript the first of the columns transcription, text, sentence, normalized_text,
transcript; speaker_id, speaker or client_id name the speaker (else each file is its own) and
language, locale or lang its language (names and BCP-47 codes are mapped by the validator). A CSV is
read with Python's csv module (quoted commas and line breaks inside a field are one field); a
metadata.jsonl holds one object per line with the same names. The key is the file's name without
extension (its relative path, "/" as "-", where two files of a set share a name). LJSpeech: the key is
the id, the transcript the normalized text (the raw one where a line has no third field), one speaker.

Nothing is dropped: a row without transcript is an empty one and a missing file stays a path, both
rejected and counted by the validator; a row without file_name, or a metadata file without the
columns, stops naming file and line.

Sets: the split folders train, dev/valid/validation/val (the dev set) and any others (test sets); a
single metadata file is all train. Without a dev set, --dev-speakers speakers are held out of train (by
utterance, with a warning, when there are fewer than two speakers: recipes/common.py hold_out_dev).

  .venv/bin/python -m recipes.audiofolder.prepare --corpus-dir /path/to/my_audiofolder --data-dir data
"""

from __future__ import annotations

import csv
import logging
import re
from collections.abc import Iterator
from pathlib import Path

from funasr_recipe.core.jsonl import iter_jsonl
from funasr_recipe.data.corpus import CorpusInfo
from recipes.common import CorpusLayoutError, Utt
from recipes.user_data import (
    listing,
    own_main,
    set_names,
    write_own_sets,
)

log = logging.getLogger(__name__)

METADATA = ("metadata.csv", "metadata.jsonl")
TEXT_COLUMNS = ("transcription", "text", "sentence", "normalized_text", "transcript")
SPEAKER_COLUMNS = ("speaker_id", "speaker", "client_id")
LANGUAGE_COLUMNS = ("language", "locale", "lang")
LJSPEECH_SPEAKER = "ljspeech"


def metadata_in(folder: Path) -> Path | None:
    """The metadata file of a folder, or None; both forms at once is a CorpusLayoutError."""
    found = [folder / m for m in METADATA if (folder / m).is_file()]
    if len(found) > 1:
        raise CorpusLayoutError(f"{folder} has both {METADATA[0]} and {METADATA[1]}; keep one")
    return found[0] if found else None


def find_sets(corpus_dir: Path) -> dict[str, Path]:
    """{set name: metadata file}: one folder per split, or one metadata file for the folder (train)."""
    if not corpus_dir.is_dir():
        raise CorpusLayoutError(f"expected a folder of audio with metadata.csv at {corpus_dir}")
    top = metadata_in(corpus_dir)
    splits = {d.name: m for d in sorted(corpus_dir.iterdir()) if d.is_dir() and (m := metadata_in(d))}
    if top and splits:
        raise CorpusLayoutError(f"{top} and split folders with their own metadata ({' '.join(splits)}): give "
                                "one metadata file per split folder, or one for the whole folder")
    if top:
        return {"train": top}
    if not splits:
        raise CorpusLayoutError(f"no metadata.csv or metadata.jsonl in {corpus_dir} or its folders; found "
                                f"{listing(sorted(p.name for p in corpus_dir.iterdir()))}")
    if "train" not in splits:
        raise CorpusLayoutError(f"no train folder with a metadata file in {corpus_dir}; the split folders "
                                f"are {listing(splits)}")
    names = set_names(splits)
    return {names[split]: path for split, path in splits.items()}


def is_ljspeech(path: Path) -> bool:
    """True for an LJSpeech metadata.csv: a first line of `id|text[|normalized]` without file_name."""
    with open(path, encoding="utf-8-sig", newline="") as f:
        first = f.readline()
    return path.suffix == ".csv" and "|" in first and "file_name" not in first


def ljspeech_rows(path: Path) -> Iterator[tuple[int, dict]]:
    """(line, row) of an LJSpeech metadata.csv; quotes are text there, not CSV quoting."""
    with open(path, encoding="utf-8-sig", newline="") as f:
        for lineno, fields in enumerate(csv.reader(f, delimiter="|", quoting=csv.QUOTE_NONE), 1):
            if not fields:
                continue
            text = fields[1] if len(fields) > 1 else ""
            if len(fields) > 2 and fields[2].strip():
                text = fields[2]
            yield lineno, {"file_name": f"wavs/{fields[0]}.wav", "text": text, "speaker_id": LJSPEECH_SPEAKER,
                           "_key": fields[0]}


def csv_rows(path: Path) -> Iterator[tuple[int, dict]]:
    """(line, row) of a metadata.csv with a header, read by the csv module (RFC 4180 quoting)."""
    with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.DictReader(f)
        try:
            for row in reader:
                yield reader.line_num, row
        except csv.Error as e:
            raise CorpusLayoutError(f"{path}:{reader.line_num}: not CSV ({e})") from None


def rows_of(path: Path) -> Iterator[tuple[int, dict]]:
    """(line, row) of any metadata file."""
    if path.suffix == ".jsonl":
        return iter_jsonl(path)
    return ljspeech_rows(path) if is_ljspeech(path) else csv_rows(path)


def column(row: dict, names: tuple[str, ...]) -> str | None:
    """The value of the first of ``names`` that the row has, as a string; None when none."""
    for name in names:
        if row.get(name) is not None:
            return str(row[name]).strip()
    return None


def read_set(path: Path) -> list[Utt]:
    """The utterances of one metadata file, in file order."""
    utts: list[Utt] = []
    names: list[str] = []
    for lineno, row in rows_of(path):
        where = f"{path}:{lineno}"
        if not utts:  # the header (or the first object) names the columns
            if "file_name" not in row:
                raise CorpusLayoutError(f"{where}: no file_name column (the audio's path, Hugging Face's "
                                        f"audiofolder convention); the columns are {listing(row)}")
            if not any(c in row for c in TEXT_COLUMNS):
                raise CorpusLayoutError(f"{where}: no transcript column (one of {', '.join(TEXT_COLUMNS)}); "
                                        f"the columns are {listing(row)}")
        name = (row.get("file_name") or "").strip()
        if not name:
            raise CorpusLayoutError(f"{where}: an empty file_name")
        audio = Path(name) if Path(name).is_absolute() else path.parent / name
        speaker = column(row, SPEAKER_COLUMNS)
        utts.append(Utt(key=row.get("_key", ""), path=str(audio.absolute()),
                        text=column(row, TEXT_COLUMNS) or "", speaker=speaker or "",
                        language=column(row, LANGUAGE_COLUMNS) or None))
        names.append(name)
    if not utts:
        raise CorpusLayoutError(f"{path}: no rows")
    stems = [re.sub(r"[^A-Za-z0-9_.+-]", "_", Path(n).stem) for n in names]
    if len(set(stems)) < len(stems):
        log.info("%s: files of the same name in several folders: keys are their relative paths", path)
        stems = [re.sub(r"[^A-Za-z0-9_.+-]", "_", str(Path(n).with_suffix("")).replace("/", "-"))
                 for n in names]
    for utt, stem in zip(utts, stems, strict=True):
        utt.key = utt.key or stem
        utt.speaker = utt.speaker or utt.key
    log.info("%s: %d utterances, %d speakers", path, len(utts), len({u.speaker for u in utts}))
    return utts


def prepare(corpus_dir: Path, data_dir: Path, dev_speakers: int | None = None, **tags: str) -> CorpusInfo:
    """Write one Kaldi data dir per split of the audio folder (a dev set held out if none), and
    corpus.json."""
    sets = {name: read_set(path) for name, path in find_sets(corpus_dir).items()}
    return write_own_sets("audiofolder", corpus_dir, data_dir, sets, dev_speakers, **tags)


def main() -> None:
    """Command line entry point."""
    own_main(prepare, __doc__, "whose row has none")


if __name__ == "__main__":
    main()
