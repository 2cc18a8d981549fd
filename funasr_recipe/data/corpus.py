"""The description of a prepared corpus, ``data/corpus.json``: which sets there are, which one trains,
which one validates, which are tested, and the tags declared for utterances without their own.

Written by a corpus recipe (recipes/) in stage 0; read by run.sh (through ``python -m local.corpus_info``)
and by the later stages.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from funasr_recipe.core.rejections import BadInputError


@dataclass
class CorpusInfo:
    """What stage 0 and later stages need to know about a prepared corpus (``data/corpus.json``)."""

    corpus: str
    corpus_dir: str
    train_set: str
    valid_set: str
    test_sets: list[str]
    language: str  # declared language of utterances without utt2lang (SenseVoice code: en, zh, ...)
    emotion: str = "NEUTRAL"  # declared emotion tag for utterances without utt2emo
    event: str = "Speech"  # declared event tag for utterances without utt2event
    itn: str = "woitn"  # "withitn" when transcripts keep punctuation and case
    sets: list[str] = field(default_factory=list)  # every set written under data/

    def __post_init__(self) -> None:
        if not self.sets:
            self.sets = sorted({self.train_set, self.valid_set, *self.test_sets})


def write_corpus_info(data_dir: Path, info: CorpusInfo) -> Path:
    """Write data_dir/corpus.json, which run.sh and the later stages read the set names from."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / "corpus.json"
    path.write_text(json.dumps(asdict(info), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def read_corpus_info(data_dir: Path) -> CorpusInfo:
    """Read data_dir/corpus.json as written by write_corpus_info."""
    path = Path(data_dir) / "corpus.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: run stage 0 first (./run.sh --stage 0 --stop-stage 0)")
    try:
        return CorpusInfo(**json.loads(path.read_text(encoding="utf-8")))
    except (json.JSONDecodeError, TypeError) as e:  # not JSON, or not the fields CorpusInfo has
        raise BadInputError(f"{path}: not a corpus.json that a recipe wrote ({e}); rerun stage 0") from None
