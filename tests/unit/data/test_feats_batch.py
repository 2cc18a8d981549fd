"""Whole batches of stage-1 features (data/feats_batch.py, data/shm_pool.py) against the per-utterance path.

The reference is the dataset as it was before batches were built whole: kaldiio's ``load_mat``, then
``features.cmvn.lfr`` and funasr's ``apply_cmvn`` per utterance, the four tags and the text each
encoded on its own, and funasr's own collator. Every batch that funasr's DataloaderMapStyle delivers
(0, 1 and 2 workers, so also after crossing a process boundary) must hold exactly those tensors.
Reads stage 1's dump of the bundled digits (tests/helpers/stage1_data.py); writes arks under tmp paths.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import kaldiio
import numpy as np
import pytest
import torch
from funasr.datasets.audio_datasets.datasets import AudioDataset
from funasr.datasets.dataloader_entry import DataloaderMapStyle
from funasr.datasets.sense_voice_datasets.datasets import SenseVoiceCTCDataset
from funasr.frontends.wav_frontend import apply_cmvn

import funasr_recipe.data.batch_sampler  # noqa: F401  (registers LengthBucketBatchSampler)
import funasr_recipe.data.feats_dataset  # noqa: F401  (registers the Fbank* datasets)
from funasr_recipe.data.feats_batch import ArkReader, lfr_frames, lfr_into
from funasr_recipe.data.shm_pool import SlotPool
from funasr_recipe.features.cmvn import lfr
from funasr_recipe.model.sensevoice_tokenizer import SenseVoiceTagTokenizer
from tests.helpers.stage1_data import frontend, jsonl

# Each Fbank dataset and the funasr class whose collator is the reference.
PARENTS = {"FbankSenseVoiceCTCDataset": SenseVoiceCTCDataset, "FbankAudioDataset": AudioDataset}
BATCH = 400  # padded fbank frames: about ten batches of the 72 training utterances (24 x 3 speeds)


def loader(dumped: Path, dataset: str, workers: int, train: Path | None = None,
           **conf: object) -> DataloaderMapStyle:
    tok = SenseVoiceTagTokenizer(bpemodel=str(dumped / "tok" / "chn_jpn_yue_eng_ko_spectok.bpe.model"))
    conf = {"index_ds": "IndexDSJsonl", "batch_sampler": "LengthBucketBatchSampler", "batch_type": "token",
            "batch_size": BATCH, "shuffle": True, "seed": 0, "num_workers": workers, "pin_memory": False,
            "data_split_num": 1, **conf}
    data, dev = str(train or dumped / "train" / "data.jsonl"), str(dumped / "dev" / "data.jsonl")
    return DataloaderMapStyle(frontend=frontend(dumped / "train" / "am.mvn"), tokenizer=tok, dataset=dataset,
                              train_data_set_list=data, valid_data_set_list=dev, dataset_conf=conf)


def reference_sample(ds, index: int) -> dict[str, torch.Tensor]:
    """One utterance as the dataset computed it before: kaldiio, lfr, funasr's apply_cmvn."""
    item, fe = ds.index_ds[index], ds.frontend
    speech = apply_cmvn(torch.from_numpy(lfr(kaldiio.load_mat(item["source"]), fe.lfr_m, fe.lfr_n)), fe.cmvn)
    if isinstance(ds, SenseVoiceCTCDataset):
        ids = []
        for text in (item.get("text_language", "<|zh|>"), item.get("emo_target", "<|NEUTRAL|>"),
                     item.get("event_target", "<|Speech|>"), item.get("with_or_wo_itn", "<|woitn|>"),
                     item["target"]):
            ids += ds.tokenizer.encode(text, allowed_special="all")
    else:
        ids = ds.tokenizer.encode(item["target"])
    return {"speech": speech, "speech_lengths": torch.tensor([speech.shape[0]], dtype=torch.int32),
            "text": torch.tensor(ids, dtype=torch.int64),
            "text_lengths": torch.tensor([len(ids)], dtype=torch.int32)}


def reference_batch(ds, indices: list[int]) -> dict[str, torch.Tensor]:
    return PARENTS[type(ds).__name__].collator(ds, [reference_sample(ds, i) for i in indices])


def assert_same(got: dict, want: dict) -> None:
    assert list(got) == list(want)
    for key in want:
        assert got[key].dtype == want[key].dtype and got[key].shape == want[key].shape, key
        assert torch.equal(got[key], want[key]), key


@pytest.mark.parametrize("m,n", [(7, 6), (1, 1), (5, 3), (3, 1), (7, 1), (2, 4), (1, 6)])
def test_lfr_into_writes_what_lfr_returns(m: int, n: int) -> None:
    rng = np.random.default_rng(0)
    shift = rng.standard_normal(m * 4).astype(np.float32)
    for frames in range(1, 41):
        mat = rng.standard_normal((frames, 4)).astype(np.float32)
        out = np.full((lfr_frames(frames, n), m * 4), np.nan, dtype=np.float32)
        lfr_into(mat, m, n, out)
        assert np.array_equal(out, lfr(mat, m, n)), frames
        lfr_into(mat, m, n, out, shift)
        assert np.array_equal(out, lfr(mat, m, n) + shift), frames


def test_ark_reader_reads_what_kaldiio_reads(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    mats = {f"u{i}": rng.standard_normal((t, 80)).astype(np.float32) for i, t in enumerate([1, 7, 333, 64])}
    mats["double"] = rng.standard_normal((9, 80))
    ark, scp = tmp_path / "a.ark", tmp_path / "a.scp"
    with kaldiio.WriteHelper(f"ark,scp:{ark},{scp}") as writer:
        for key, mat in mats.items():
            writer(key, mat)
    with kaldiio.WriteHelper(f"ark,scp:{tmp_path / 'c.ark'},{tmp_path / 'c.scp'}",
                             compression_method=2) as writer:
        writer("compressed", mats["u2"])
    sources = dict(line.split() for line in (scp.read_text() + (tmp_path / "c.scp").read_text()).splitlines())
    reader = ArkReader(max_open=1)  # two files: every switch closes one and reopens the other
    for hint in (0, 7, 100000):  # too short, right for one, too long: the header decides
        for key, source in sources.items():
            got = reader.read(source, hint, 80)
            assert got.dtype == kaldiio.load_mat(source).dtype
            assert np.array_equal(got, kaldiio.load_mat(source)), (key, hint)
    cut = tmp_path / "cut.ark"
    cut.write_bytes(ark.read_bytes()[: int(sources["u2"].rsplit(":", 1)[1]) + 500])
    with pytest.raises(RuntimeError, match="cut.ark:.*rerun stage 1"):
        reader.read(f"{cut}:{sources['u2'].rsplit(':', 1)[1]}", 333, 80)


@pytest.mark.parametrize("dataset", sorted(PARENTS))
@pytest.mark.parametrize("workers", [0, 1, 2])
def test_every_batch_is_bit_identical_to_the_per_utterance_path(dumped: Path, dataset: str,
                                                                 workers: int) -> None:
    entry = loader(dumped, dataset, workers)
    for epoch in range(2):
        train, _ = entry.build_iter(epoch=epoch)
        batches = list(train.batch_sampler)
        assert len(batches) > 2
        delivered = list(train)  # all held at once: more batches than the pool has slots
        assert len(delivered) == len(batches)
        for indices, batch in zip(batches, delivered, strict=True):
            assert type(batch) is dict
            assert_same(batch, reference_batch(train.dataset, indices))


def test_batches_of_uint16_features_are_those_kaldiio_decodes(dumped: Path, tmp_path: Path) -> None:
    """``feats_storage: uint16`` (Kaldi's CM2 matrices): the reader decodes them itself, and every batch
    is the per-utterance path's on kaldiio's decoding, across a worker too."""
    lines = jsonl(dumped / "train" / "data.jsonl")
    ark, scp = tmp_path / "u16.ark", tmp_path / "u16.scp"
    with kaldiio.WriteHelper(f"ark,scp:{ark},{scp}", compression_method=3) as writer:
        for line in lines:
            writer(line["key"], kaldiio.load_mat(line["source"]))
    sources = dict(row.split(" ", 1) for row in scp.read_text().splitlines())
    small = tmp_path / "u16.jsonl"
    small.write_text("".join(json.dumps({**line, "source": sources[line["key"]]}) + "\n" for line in lines))
    for workers in (0, 1):
        train, _ = loader(dumped, "FbankSenseVoiceCTCDataset", workers, small).build_iter(epoch=0)
        for indices, batch in zip(list(train.batch_sampler), train, strict=True):
            assert_same(batch, reference_batch(train.dataset, indices))


def test_wrong_lengths_in_the_jsonl_change_nothing(dumped: Path, tmp_path: Path) -> None:
    lines = jsonl(dumped / "train" / "data.jsonl")
    for i, line in enumerate(lines):  # off by up to a few LFR frames either way, or missing
        if i % 3 == 0:
            line["source_len"] += (-13, 5, 40)[i % 9 // 3]
        elif i % 3 == 1:
            del line["source_len"]
    wrong = tmp_path / "wrong.jsonl"
    wrong.write_text("".join(json.dumps(line) + "\n" for line in lines))
    train, _ = loader(dumped, "FbankSenseVoiceCTCDataset", 1, wrong).build_iter(epoch=0)
    for indices, batch in zip(list(train.batch_sampler), train, strict=True):
        assert_same(batch, reference_batch(train.dataset, indices))
    del batch
    # The worker's first try at each batch took a buffer and gave it back: none is left taken.
    pool = train.dataset._pool
    assert pool._issued.sum() > 0 and (pool._issued == pool._released).all()


def test_batch_buffers_are_recycled_only_once_released(dumped: Path) -> None:
    for workers in (0, 1):
        train, _ = loader(dumped, "FbankSenseVoiceCTCDataset", workers).build_iter(epoch=0)
        pool = train.dataset._pool
        assert pool is not None
        in_pool = [pool._slot_of(b["speech"]) is not None for b in train]  # each dropped before the next
        assert all(in_pool) and len(in_pool) > pool.slots
        held = list(train)
        slots = [pool._slot_of(b["speech"]) for b in held]
        taken = [s for s in slots if s is not None]
        assert len(taken) == len(set(taken)), "two held batches share a buffer"
        assert None in slots  # more held batches than slots: the rest in fresh memory
        del held
        assert (pool._issued == pool._released).all()  # every buffer free again once dropped


def test_a_view_keeps_its_slot_busy() -> None:
    pool = SlotPool(regions=1, slots=1, slot_bytes=4096)
    first = pool.tensor((4, 8), torch.float32)
    assert first is not None and pool.tensor((4, 8), torch.float32) is None
    view = first[1:, ::2]
    del first
    assert pool.tensor((4, 8), torch.float32) is None
    del view
    assert pool.tensor((4, 8), torch.float32) is not None
    assert pool.tensor((4096,), torch.float32) is None  # larger than a slot


def test_a_pool_pickled_for_a_spawned_worker_is_none_there() -> None:
    copy = pickle.loads(pickle.dumps(SlotPool(regions=2, slots=2, slot_bytes=4096)))
    assert copy.tensor((2,), torch.float32) is None
    assert copy.reduce(torch.zeros(2)) is None


def test_reuse_batch_memory_false_allocates_every_batch(dumped: Path) -> None:
    train, _ = loader(dumped, "FbankSenseVoiceCTCDataset", 1, reuse_batch_memory=False).build_iter(epoch=0)
    assert train.dataset._pool is None
    for indices, batch in zip(list(train.batch_sampler), train, strict=True):
        assert_same(batch, reference_batch(train.dataset, indices))
