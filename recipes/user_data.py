"""Helpers of the recipes that read the user's own data rather than one public corpus: kaldi, jsonl,
lhotse and audiofolder. They share the set naming rules, the choice of the dev set, and the options
that declare the tags of utterances which carry none. Reads and writes nothing itself.
"""

from __future__ import annotations

import argparse
import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import fields
from pathlib import Path
from typing import Any

from funasr_recipe.data.corpus import CorpusInfo
from recipes.common import CorpusLayoutError, Utt, hold_out_dev, recipe_parser, run_recipe, write_sets

log = logging.getLogger(__name__)

VALID_NAMES = ("dev", "valid", "validation", "val")  # a set of one of these names is the dev set
SET_NAME = re.compile(r"^[A-Za-z0-9_.+-]+$")  # a set name is a directory name and a shell word
TAG_DEFAULTS = {f.name: f.default for f in fields(CorpusInfo) if f.name in ("emotion", "event", "itn")}
TAG_DEFAULTS["language"] = "en"


def listing(names: Iterable[str], limit: int = 20) -> str:
    """The first ``limit`` names, and how many more there are."""
    names = list(names)
    shown = " ".join(names[:limit]) or "nothing"
    return shown + (f" ... ({len(names) - limit} more)" if len(names) > limit else "")


def set_names(splits: Iterable[str]) -> dict[str, str]:
    """{split: set name}: characters a set name may not have (SET_NAME) become "_"; a name that is still
    not one, or two splits that become the same name, are a CorpusLayoutError."""
    names = {split: re.sub(r"[^A-Za-z0-9_.+-]", "_", split) for split in splits}
    for split, name in names.items():
        if not SET_NAME.match(name) or not name.strip("."):
            raise CorpusLayoutError(f"split {split!r}: {name!r} cannot be a set (directory) name; rename it")
    if clashes := sorted(s for s in names if sum(n == names[s] for n in names.values()) > 1):
        raise CorpusLayoutError(f"splits {clashes} would all be written as the same set; rename them")
    return names


def dev_name(names: Iterable[str], prefix: bool = False) -> str | None:
    """The dev set among the set names: the first of VALID_NAMES (any case); with ``prefix`` else the
    first name that starts with "dev" (LibriSpeech's dev-clean); else None."""
    names = sorted(names)
    lower = {n.lower(): n for n in names}
    dev = next((lower[v] for v in VALID_NAMES if v in lower), None)
    if dev is None and prefix:
        dev = next((n for n in names if n.lower().startswith("dev")), None)
    return dev


def settle_dev(sets: dict[str, list[Utt]], dev: str | None, where: Path,
               dev_speakers: int | None) -> str:
    """Name the dev set of ``sets`` (``{set: utterances}``, with "train"), holding out --dev-speakers
    speakers of train as "dev" when the corpus brings none (recipes/common.py hold_out_dev); returns
    its name. --dev-speakers with a dev set of the corpus's own is a warning: nobody reads it."""
    if dev is None:
        log.info("%s has no dev set (%s): holding out dev speakers of train", where, ", ".join(VALID_NAMES))
        sets["train"], sets["dev"] = hold_out_dev(sets["train"], dev_speakers)
        return "dev"
    if dev_speakers is not None:
        log.warning("--dev-speakers %d is ignored: %s is the dev set", dev_speakers, dev)
    return dev


def add_tag_options(parser: argparse.ArgumentParser, without: str = "without one") -> None:
    """--language/--emotion/--event/--itn (the tags of the utterances ``without`` their own) and
    --dev-speakers (a number of speakers, for a corpus without a dev set)."""
    parser.add_argument("--language", default="en", help=f"language of the utterances {without}: a "
                        "SenseVoice code (en, zh, yue, ja, ko), a name or an ISO/BCP-47 code such as "
                        "English or en-US (default: %(default)s)")
    parser.add_argument("--emotion", default=TAG_DEFAULTS["emotion"],
                        help=f"emotion of the utterances {without} (default: %(default)s)")
    parser.add_argument("--event", default=TAG_DEFAULTS["event"],
                        help=f"event of the utterances {without} (default: %(default)s)")
    parser.add_argument("--itn", default=TAG_DEFAULTS["itn"], choices=("withitn", "woitn"),
                        help="withitn when the transcripts keep punctuation and case (default: %(default)s)")
    parser.add_argument("--dev-speakers", type=int, default=None,
                        help="number of speakers held out as dev when the corpus has no dev set "
                        "(default: 5%% of the speakers, at least 1)")


def tag_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of a prepare() from the options of ``recipe_parser`` + ``add_tag_options``."""
    return {"corpus_dir": args.corpus_dir, "data_dir": args.data_dir, "language": args.language,
            "emotion": args.emotion, "event": args.event, "itn": args.itn, "dev_speakers": args.dev_speakers}


def own_corpus_info(corpus: str, corpus_dir: Path, sets: Iterable[str], dev: str, **tags: str) -> CorpusInfo:
    """corpus.json of an own-data recipe: train, the dev set, every other set a test set; the declared
    tags (language, emotion, event, itn) as given, else TAG_DEFAULTS."""
    if unknown := set(tags) - set(TAG_DEFAULTS):
        raise TypeError(f"unknown tags {sorted(unknown)}")
    return CorpusInfo(corpus=corpus, corpus_dir=str(corpus_dir.resolve()), train_set="train", valid_set=dev,
                      test_sets=sorted(s for s in sets if s != "train"), **{**TAG_DEFAULTS, **tags})


def own_main(prepare: Callable[..., CorpusInfo], doc: str | None, without: str) -> None:
    """The command line of an own-data recipe: --corpus-dir, --data-dir, the tag options, --dev-speakers."""
    parser = recipe_parser(doc)
    add_tag_options(parser, without)
    run_recipe(prepare, **tag_kwargs(parser.parse_args()))


def write_own_sets(corpus: str, corpus_dir: Path, data_dir: Path, sets: dict[str, list[Utt]],
                   dev_speakers: int | None, dev_prefix: bool = False,
                   each_set: Callable[[list[Utt]], None] | None = None, **tags: str) -> CorpusInfo:
    """The end of an own-data recipe: pick or hold out the dev set (``dev_name``, ``settle_dev``), give
    each set to ``each_set`` (a last change that needs the final sets), write the Kaldi dirs and
    corpus.json (recipes/common.py write_sets); returns what corpus.json says."""
    dev = settle_dev(sets, dev_name(set(sets) - {"train"}, prefix=dev_prefix), corpus_dir, dev_speakers)
    for utts in sets.values():
        if each_set is not None:
            each_set(utts)
    return write_sets(data_dir, sets, own_corpus_info(corpus, corpus_dir, sets, dev, **tags))
