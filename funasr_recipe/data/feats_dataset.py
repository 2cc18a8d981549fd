"""funasr datasets that read stage 1's fbank instead of decoding audio every epoch.

funasr's datasets decode each utterance's audio and compute fbank in the DataLoader workers, every
epoch; with several fast GPUs per node the CPUs cannot keep up. These subclasses (registered in
funasr's ``dataset_classes`` table, so a config or ``++dataset=...`` selects them) read the fbank
that stage 1 wrote (``source`` = ``<ark>:<offset>``) and apply only the cheap part of the model's
``WavFrontend`` on the fly, with the frontend's own ``lfr_m``/``lfr_n``/``am.mvn``: low-frame-rate
stacking (``features.cmvn.lfr``, bit-identical to funasr's ``apply_lfr`` and half the time, as it stacks
with one gather instead of stack-pad-stride-clone) and funasr's ``apply_cmvn``. Everything else
(index, sampler, collator, targets) is funasr's.

Unlike funasr's, a sample that cannot be loaded is an error naming the source, never silently
replaced by a random other utterance.
"""

from __future__ import annotations

import kaldiio
import torch
from funasr.datasets.audio_datasets.datasets import AudioDataset
from funasr.datasets.sense_voice_datasets.datasets import SenseVoiceCTCDataset
from funasr.frontends.wav_frontend import WavFrontend, apply_cmvn
from funasr.register import tables

from funasr_recipe.features.cmvn import lfr

# What --feats-type fbank puts in place of each funasr dataset.
FBANK_DATASETS = {"SenseVoiceCTCDataset": "FbankSenseVoiceCTCDataset", "AudioDataset": "FbankAudioDataset"}


def load_features(source: str, frontend: WavFrontend) -> torch.Tensor:
    """(frames', dim') model input from a stage-1 fbank matrix: the frontend's LFR, then its CMVN."""
    if not isinstance(frontend, WavFrontend):
        raise TypeError(f"stage-1 features need a WavFrontend, the config has {type(frontend).__name__}")
    try:
        mat = kaldiio.load_mat(source)
    except Exception as e:  # kaldiio raises bare Exceptions, OSError, ValueError...
        raise RuntimeError(f"cannot read features {source}: {e}; rerun stage 1") from e
    if mat.ndim != 2 or mat.shape[1] != frontend.n_mels:
        raise ValueError(f"features {source} have shape {mat.shape}, the frontend expects "
                         f"{frontend.n_mels} mel bins: rerun stage 1 with this config")
    # lfr() gathers into a new array (a copy even for m = n = 1): apply_cmvn works in place, and
    # kaldiio may hand out a read-only array.
    stacked = lfr(mat, frontend.lfr_m, frontend.lfr_n)
    feats = torch.from_numpy(stacked if stacked is not mat else mat.copy())
    if frontend.cmvn is not None:
        feats = apply_cmvn(feats, frontend.cmvn)
    return feats


def _speech_and_target(dataset: AudioDataset | SenseVoiceCTCDataset, index: int) -> tuple:
    """(item, model input, transcript) of one utterance: stage-1 features, funasr's text preprocessing."""
    item = dataset.index_ds[index]
    target = item["target"]
    if dataset.preprocessor_text:
        target = dataset.preprocessor_text(target)
    return item, load_features(item["source"], dataset.frontend), target


def _sample(speech: torch.Tensor, ids: list[int]) -> dict[str, torch.Tensor]:
    """One sample in the layout funasr's collators expect."""
    return {
        "speech": speech,
        "speech_lengths": torch.tensor([speech.shape[0]], dtype=torch.int32),
        "text": torch.tensor(ids, dtype=torch.int64),
        "text_lengths": torch.tensor([len(ids)], dtype=torch.int32),
    }


@tables.register("dataset_classes", "FbankSenseVoiceCTCDataset")
class FbankSenseVoiceCTCDataset(SenseVoiceCTCDataset):
    """``SenseVoiceCTCDataset`` on stage-1 features; targets built as funasr builds them."""

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        item, speech, target = _speech_and_target(self, index)

        def encode(text: str) -> list[int]:
            return self.tokenizer.encode(text, allowed_special="all")

        # funasr's SenseVoiceCTCDataset order and defaults: [lid, emo, event, itn, text].
        ids = (encode(item.get("text_language", "<|zh|>")) + encode(item.get("emo_target", "<|NEUTRAL|>"))
               + encode(item.get("event_target", "<|Speech|>"))
               + encode(item.get("with_or_wo_itn", "<|woitn|>")) + encode(target))
        return _sample(speech, ids)


@tables.register("dataset_classes", "FbankAudioDataset")
class FbankAudioDataset(AudioDataset):
    """``AudioDataset`` (Paraformer, Conformer-CTC) on stage-1 features."""

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        _, speech, target = _speech_and_target(self, index)
        return _sample(speech, self.tokenizer.encode(target))
