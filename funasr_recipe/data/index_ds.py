"""``IndexDSJsonlMmap``: funasr's training index (``IndexDSJsonl``) without a dict per utterance.

funasr's ``IndexDSJsonlRankFull`` (all three IndexDSJsonl names) parses every line of the training list
into a dict that every training process holds: hundreds of bytes per utterance, times the ranks of a node
and the DataLoader workers forked from them (reference counts write to, and so copy, the pages). This
index maps data/line_index.py's file of each jsonl (shared by every process of the node) and keeps only
which lines pass the filters (nothing when every line does); an item is parsed when it is fetched.

Same items, in the same order, as funasr's: lines without "source" are not items; the filters
min_source_length <= source_len <= max_source_length, min_target_length <= target_len <=
max_target_length, source_len + target_len <= max_token_length (dataset_conf, funasr's defaults 0/2048,
0/2048, 2200); the item dict funasr builds (source with its "/cpfs01" rewrite, prompt, target without
spaces for an "aishell" source not in English, source_len, target_len, and text_language, emo_target,
event_target, with_or_wo_itn where the line has them). A path that ends in neither .jsonl nor .json is a
list file of jsonl paths, sliced by data_split_num / data_split_i in training as funasr slices it.
Unlike funasr's: blank lines are skipped (funasr fails on them); bad input (a line that is not JSON, a
length that is not an integer, a "text" field, an empty list, a listed jsonl that is missing) is a
BadInputError naming the file and line.

For the batch samplers: ``source_lengths()`` (every item's source_len, an array) and ``source_len_at(i)``
read the mapped lengths without parsing a line (data/batch_sampler.py, data/feats_dataset.py use them).

Reads  the jsonl (or list file) and the indexes of data/line_index.py (built first when missing or stale);
writes nothing else. Registered in funasr's ``index_ds_classes`` on import:

  dataset_conf: {index_ds: IndexDSJsonlMmap, ...}      # every conf/*.yaml
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch
from funasr.register import tables

from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.data.line_index import HAS_SOURCE, LineIndex, load_index

log = logging.getLogger(__name__)

NAME = "IndexDSJsonlMmap"
# funasr's defaults (IndexDSJsonlRankFull.__init__): (dataset_conf key, default)
LIMITS = (("min_source_length", 0), ("max_source_length", 2048), ("min_target_length", 0),
          ("max_target_length", 2048), ("max_token_length", 2200))
CHUNK = 1 << 16  # lines filtered at a time: the temporaries stay under 2 MB whatever the corpus size


def list_files(path: str, kwargs: dict) -> list[Path]:
    """The jsonl files of ``path`` as funasr's index takes them: itself, or the lines of a list file
    (any name not ending in .jsonl / .json), sliced by data_split_num / data_split_i in training."""
    if path.endswith((".jsonl", ".json")):
        return [Path(path)]
    split_num, split_i = kwargs.get("data_split_num", 1), kwargs.get("data_split_i", 0)
    if not kwargs.get("is_training", True):
        split_num, split_i = 1, 0
    try:
        with open(path, encoding="utf-8") as f:
            entries = f.readlines()
    except OSError as e:
        raise BadInputError(f"{path}: cannot read the list of jsonl files ({e.strerror})") from None
    per_slice = (len(entries) - 1) // split_num + 1
    numbered = list(enumerate(entries, 1))[split_i * per_slice : (split_i + 1) * per_slice]
    files = []
    for lineno, entry in numbered:
        if not entry.strip():
            continue
        file = Path(entry.strip())
        if not file.is_file():
            raise BadInputError(f"{path}:{lineno}: {file} is not a file (the list names one jsonl a line)")
        files.append(file)
    if not files:
        raise BadInputError(f"{path}: the list names no jsonl file"
                            + (f" in slice {split_i} of {split_num}" if split_num > 1 else ""))
    return files


def funasr_item(data: dict) -> dict:
    """The dict funasr's IndexDSJsonlRankFull keeps of a parsed line that has a "source"."""
    source = data["source"].replace("/cpfs01", "/cpfs_speech/data")
    target = data["target"]
    if "aishell" in source and data.get("text_language", "") != "en":
        target = target.replace(" ", "")
    item = {"source": source, "prompt": data.get("prompt", "<ASR>"), "target": target,
            "source_len": data.get("source_len", 1), "target_len": data.get("target_len", 0)}
    if data.get("text_language") is not None:
        item["text_language"] = data["text_language"]
    for name in ("emo_target", "event_target", "with_or_wo_itn"):
        if name in data:
            item[name] = data[name]
    return item


def kept_lines(index: LineIndex, limits: dict[str, float]) -> np.ndarray | None:
    """Line numbers of ``index`` that are items under funasr's filters; None when every line is."""
    parts, every = [], True
    for start in range(0, len(index), CHUNK):
        s = index.source_len[start : start + CHUNK].astype(np.int64)
        t = index.target_len[start : start + CHUNK].astype(np.int64)
        keep = ((index.flags[start : start + CHUNK] & HAS_SOURCE) != 0) \
            & (s >= limits["min_source_length"]) & (s <= limits["max_source_length"]) \
            & (t >= limits["min_target_length"]) & (t <= limits["max_target_length"]) \
            & (s + t <= limits["max_token_length"])
        every &= bool(keep.all())
        parts.append(np.flatnonzero(keep) + start)
    if every:
        return None
    kept = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    return kept.astype(np.int32) if len(index) < 1 << 31 else kept


@tables.register("index_ds_classes", NAME)
class IndexDSJsonlMmap(torch.utils.data.Dataset):
    """funasr's index interface (``len``, ``[i]`` -> item dict, ``get_source_len(item)``,
    ``get_target_len(item)``) over mapped line indexes; see the module docstring."""

    def __init__(self, path: str, **kwargs: Any) -> None:
        super().__init__()
        self.path = path
        for name, default in LIMITS:
            value = kwargs.get(name, default)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise BadInputError(f"dataset_conf.{name} must be a number, got {value!r}")
            setattr(self, name, value)
        limits = {name: getattr(self, name) for name, _ in LIMITS}
        self.indexes = [load_index(file) for file in list_files(str(path), kwargs)]
        self.kept = [kept_lines(index, limits) for index in self.indexes]
        counts = [len(index) if kept is None else len(kept) for index, kept in zip(self.indexes, self.kept,
                                                                                    strict=True)]
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        lines = sum(len(index) for index in self.indexes)
        # funasr's own line, which the fault tests and users' log greps look for.
        logging.info("total_num of samplers: %d, %s", len(self), path)
        log.info("%s: %d items of %d lines in %d file(s), mapped", NAME, len(self), lines, len(self.indexes))

    def __len__(self) -> int:
        return int(self.starts[-1])

    def locate(self, index: int) -> tuple[LineIndex, int]:
        """(the file's index, line number) of item ``index``."""
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"item {index} of {n}")
        f = 0 if len(self.indexes) == 1 else int(np.searchsorted(self.starts, index, side="right")) - 1
        i = index - int(self.starts[f])
        kept = self.kept[f]
        return self.indexes[f], i if kept is None else int(kept[i])

    def __getitem__(self, index: int) -> dict:
        file, line = self.locate(index)
        raw = file.line(line)
        try:
            return funasr_item(json.loads(raw))
        except (ValueError, KeyError, AttributeError) as e:  # the index checked it: the file changed since
            raise BadInputError(f"{file.jsonl}:{line + 1}: changed since it was indexed ({e}); restart "
                                "training to index it again") from None

    def source_len_at(self, index: int) -> int:
        file, line = self.locate(index)
        return int(file.source_len[line])

    def target_len_at(self, index: int) -> int:
        file, line = self.locate(index)
        return int(file.target_len[line])

    def source_lengths(self) -> np.ndarray:
        """Every item's source_len, in item order: the mapped array itself for one unfiltered file."""
        parts = [index.source_len if kept is None else index.source_len[kept]
                 for index, kept in zip(self.indexes, self.kept, strict=True)]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def get_source_len(self, data_dict: dict) -> Any:
        return data_dict.get("source_len", 1)

    def get_target_len(self, data_dict: dict) -> Any:
        return data_dict.get("target_len", 0)
