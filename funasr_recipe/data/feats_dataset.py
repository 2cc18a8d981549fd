"""funasr datasets that read stage 1's fbank instead of decoding audio every epoch.

funasr's datasets decode each utterance's audio and compute fbank in the DataLoader workers, every
epoch; with several fast GPUs per node the CPUs cannot keep up. These subclasses (registered in
funasr's ``dataset_classes`` table, so a config or ``++dataset=...`` selects them) read the fbank
that stage 1 wrote (``source`` = ``<ark>:<offset>``) and apply only the cheap part of the model's
``WavFrontend`` on the fly, with the frontend's own ``lfr_m``/``lfr_n``/``am.mvn``: low-frame-rate
stacking (``features.cmvn.lfr``, bit-identical to funasr's ``apply_lfr``) and funasr's ``apply_cmvn``.
Index, sampler and targets are funasr's.

The DataLoader that funasr builds over them (batch sampler, ``collate_fn=dataset.collator``) fetches a
whole batch through ``__getitems__``: data/feats_batch.py reads, stacks, normalises and pads it in one
pass into one buffer (shared memory in a worker), and ``collator`` only finishes it; the tensors are
bit-identical to ``collator([dataset[i] for i in batch])``, the per-utterance path that the rest of
funasr (and the OOM probe) uses. The batch buffers are recycled between batches (data/shm_pool.py;
``++dataset_conf.reuse_batch_memory=false`` allocates each batch afresh, as torch does). Reads the ark
shards; writes nothing.

Unlike funasr's, a sample that cannot be loaded is an error naming the source, never silently
replaced by a random other utterance.
"""

from __future__ import annotations

from typing import Any

import torch
from funasr.datasets.audio_datasets.datasets import AudioDataset
from funasr.datasets.sense_voice_datasets.datasets import SenseVoiceCTCDataset
from funasr.frontends.wav_frontend import WavFrontend
from funasr.register import tables

from funasr_recipe.data.feats_batch import (
    ArkReader,
    WorkerBatch,
    batch_pool,
    model_input,
    new_tensor,
    pad_ids,
    read_features,
    speech_batch,
)

# What --feats-type fbank puts in place of each funasr dataset.
FBANK_DATASETS = {"SenseVoiceCTCDataset": "FbankSenseVoiceCTCDataset", "AudioDataset": "FbankAudioDataset"}


def _check_frontend(frontend: Any) -> WavFrontend:
    if not isinstance(frontend, WavFrontend):
        raise TypeError(f"stage-1 features need a WavFrontend, the config has {type(frontend).__name__}")
    return frontend


def load_features(source: str, frontend: WavFrontend, reader: ArkReader | None = None) -> torch.Tensor:
    """(frames', dim') model input from a stage-1 fbank matrix: the frontend's LFR, then its CMVN."""
    _check_frontend(frontend)
    return model_input(read_features(reader or ArkReader(), source, 0, frontend.n_mels), frontend)


class _Collated:
    """What ``__getitems__`` hands the collator: a batch that is already padded."""

    def __init__(self, batch: dict[str, torch.Tensor]) -> None:
        self.batch = batch


class _StageOneFeatures:
    """Per-utterance ``__getitem__`` and whole-batch ``__getitems__`` over stage-1 features, for a funasr
    dataset class (``index_ds``, ``frontend``, ``preprocessor_text``, pad values, ``collator``).
    With ``sources_key`` set (the divergence guard sets it), each batch also carries its utterances'
    sources under that key, so that a bad step can name its utterances."""

    sources_key: str | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Made here, in the training process, so that the DataLoader's workers inherit the mapping.
        self._pool = batch_pool(self.frontend, kwargs)

    def get_source_len(self, index: int) -> int:
        # funasr's samplers ask per utterance per epoch; its datasets fetch the item for it, which the
        # mapped index (data/index_ds.py) would parse: its length array answers instead.
        at = getattr(self.index_ds, "source_len_at", None)
        return at(index) if at is not None else super().get_source_len(index)

    def get_target_len(self, index: int) -> int:
        at = getattr(self.index_ds, "target_len_at", None)
        return at(index) if at is not None else super().get_target_len(index)

    def source_lengths(self) -> Any:
        """Every utterance's source_len as the mapped index's array, or None (funasr's own index)."""
        lengths = getattr(self.index_ds, "source_lengths", None)
        return lengths() if lengths is not None else None

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        item = self.index_ds[index]
        speech = load_features(item["source"], self.frontend, self._reader())
        ids = self._token_ids(item)
        return {
            "speech": speech,
            "speech_lengths": torch.tensor([speech.shape[0]], dtype=torch.int32),
            "text": torch.tensor(ids, dtype=torch.int64),
            "text_lengths": torch.tensor([len(ids)], dtype=torch.int32),
        }

    def __getitems__(self, indices: list[int]) -> _Collated:
        items = [self.index_ds[i] for i in indices]
        speech, lengths = speech_batch(self._reader(), [i["source"] for i in items],
                                       [self.index_ds.get_source_len(i) for i in items],
                                       _check_frontend(self.frontend), self.float_pad_value, self._alloc,
                                       None if self._pool is None else self._pool.give_back)
        text, text_lengths = pad_ids([self._token_ids(i) for i in items], self.int_pad_value)
        speech_lengths = torch.tensor(lengths, dtype=torch.int32)[:, None]
        batch = {"speech": speech, "speech_lengths": speech_lengths, "text": text,
                 "text_lengths": text_lengths}
        if self.sources_key is not None:  # a list: funasr's halving of an oversized batch slices it alike
            batch[self.sources_key] = [i["source"] for i in items]
        return _Collated(batch)

    def collator(self, samples: Any) -> dict[str, torch.Tensor]:
        """funasr's collator on a list of samples; on ``__getitems__``'s batch only what follows the
        padding in funasr's, and in a worker a dict that crosses to the trainer as the number of its
        shared buffer and a few small arrays (feats_batch.WorkerBatch)."""
        if not isinstance(samples, _Collated):
            return super().collator(samples)
        batch = self._after_padding(samples.batch)
        return WorkerBatch(batch, self._pool) if torch.utils.data.get_worker_info() is not None else batch

    def _alloc(self, shape: list[int], dtype: torch.dtype) -> torch.Tensor:
        pooled = None if self._pool is None else self._pool.tensor(shape, dtype)
        return new_tensor(shape, dtype) if pooled is None else pooled

    def _after_padding(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return batch

    def _target(self, item: dict) -> str:
        return self.preprocessor_text(item["target"]) if self.preprocessor_text else item["target"]

    def _token_ids(self, item: dict) -> list[int]:
        raise NotImplementedError

    def _reader(self) -> ArkReader:
        # One per process: a forked worker inherits the open shards (pread has no shared position).
        reader = self.__dict__.get("_ark_reader")
        if reader is None:
            reader = self.__dict__["_ark_reader"] = ArkReader()
        return reader


@tables.register("dataset_classes", "FbankSenseVoiceCTCDataset")
class FbankSenseVoiceCTCDataset(_StageOneFeatures, SenseVoiceCTCDataset):
    """``SenseVoiceCTCDataset`` on stage-1 features; targets built as funasr builds them."""

    def _token_ids(self, item: dict) -> list[int]:
        # funasr's SenseVoiceCTCDataset order and defaults: [lid, emo, event, itn, text].
        tags = (item.get("text_language", "<|zh|>"), item.get("emo_target", "<|NEUTRAL|>"),
                item.get("event_target", "<|Speech|>"), item.get("with_or_wo_itn", "<|woitn|>"))
        cache = self.__dict__.setdefault("_tag_ids", {})  # a few distinct tags, encoded once each
        ids: list[int] = []
        for tag in tags:
            if tag not in cache:
                cache[tag] = self.tokenizer.encode(tag, allowed_special="all")
            ids += cache[tag]
        return ids + self.tokenizer.encode(self._target(item), allowed_special="all")

    def _after_padding(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        # funasr's collator ends so for token batches (each pass may halve an oversized batch).
        if self.batch_type != "example":
            for i in range(10):
                batch = self._filter_badcase(batch, i=i)
        return batch


@tables.register("dataset_classes", "FbankAudioDataset")
class FbankAudioDataset(_StageOneFeatures, AudioDataset):
    """``AudioDataset`` (Paraformer, Conformer-CTC) on stage-1 features."""

    def _token_ids(self, item: dict) -> list[int]:
        return self.tokenizer.encode(self._target(item))
