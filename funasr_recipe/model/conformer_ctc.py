"""Conformer-CTC for funasr's trainer, AutoModel decoding and ONNX export (``model: ConformerCTC``).

Why the recipe has its own model class: in funasr 1.4.16 neither built-in way to a CTC-only Conformer
runs. ``model: CTC`` with ``encoder: ConformerEncoder`` builds, then fails on its first forward
(``CTC.encode`` unpacks two values from the encoder, which returns three: ValueError), and
``model: Conformer`` with ``ctc_weight: 1.0`` drops its decoder but still computes the attention loss
(TypeError: 'NoneType' object is not callable). funasr's CTC class has no ``export`` either.

This class is built from funasr's own parts (an encoder of its ``encoder_classes`` table, its CTC
module, SpecAug and normalisation tables) and adds only a CTC-only training step, greedy decoding for
``AutoModel(...).generate`` and a traceable forward for ``torch.onnx.export``. Importing this module
registers the class; model/trainer.py and model/model_dir.py import it before funasr builds the model
from a config.

  import funasr_recipe.model.conformer_ctc  # registers ConformerCTC; then funasr.AutoModel(...).model
  onnx_model = model.export()
  torch.onnx.export(onnx_model, onnx_model.export_dummy_inputs(), "model.onnx", dynamo=False,
                    input_names=onnx_model.export_input_names(),
                    output_names=onnx_model.export_output_names(),
                    dynamic_axes=onnx_model.export_dynamic_axes())
"""

from __future__ import annotations

import time
from typing import Any

import torch
from funasr.models.ctc.ctc import CTC
from funasr.models.normalize.utterance_mvn import UtteranceMVN
from funasr.models.transformer.utils import subsampling
from funasr.register import tables
from funasr.train_utils.device_funcs import force_gatherable
from funasr.utils.datadir_writer import DatadirWriter
from funasr.utils.load_utils import extract_fbank, load_audio_text_image_video
from rapidfuzz.distance import Levenshtein

from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.families.registry import CONFORMER_CTC

# Input layers that take (x, mask) and subsample both; the others take x alone (ConformerEncoder's list).
_SUBSAMPLING = (subsampling.Conv2dSubsampling, subsampling.Conv2dSubsampling2, subsampling.Conv2dSubsampling6,
                subsampling.Conv2dSubsampling8, subsampling.Conv2dSubsamplingPad)


def _build(table: str, name: str | None, conf: dict | None) -> torch.nn.Module | None:
    if name is None:
        return None
    cls = getattr(tables, table).get(name)
    if cls is None:
        raise BadInputError(f"{name!r} is not in funasr's {table}: {', '.join(getattr(tables, table))}")
    return cls(**(conf or {}))


def edit_distance(ref: list[int], hyp: list[int]) -> int:
    """Levenshtein distance between two token sequences."""
    return Levenshtein.distance(ref, hyp)


@tables.register("model_classes", CONFORMER_CTC.name)
class ConformerCTC(torch.nn.Module):
    """Encoder + CTC output layer, trained with CTC loss alone and decoded greedily."""

    def __init__(self, encoder: str = "ConformerEncoder", encoder_conf: dict | None = None,
                 input_size: int = 80, vocab_size: int = -1,
                 specaug: str | None = None, specaug_conf: dict | None = None,
                 normalize: str | None = None, normalize_conf: dict | None = None,
                 ctc_conf: dict | None = None, blank_id: int = 0, ignore_id: int = -1,
                 length_normalized_loss: bool = False, **kwargs: Any) -> None:
        super().__init__()
        if vocab_size is None or vocab_size <= 0:
            raise BadInputError(f"vocab_size {vocab_size}: funasr takes it from the tokenizer; "
                                "set tokenizer_conf.bpemodel to the model stage 1 built")
        if input_size is None:
            raise BadInputError("input_size is unknown: give the config a frontend (WavFrontend)")
        self.specaug = _build("specaug_classes", specaug, specaug_conf)
        self.normalize = _build("normalize_classes", normalize, normalize_conf)
        self.encoder = _build("encoder_classes", encoder, {"input_size": input_size, **(encoder_conf or {})})
        self.ctc = CTC(odim=vocab_size, encoder_output_size=self.encoder.output_size(), **(ctc_conf or {}))
        self.input_size = input_size
        self.vocab_size = vocab_size
        self.blank_id = blank_id
        self.ignore_id = ignore_id
        self.length_normalized_loss = length_normalized_loss

    def encode(self, speech: torch.Tensor, speech_lengths: torch.Tensor,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T, D) features -> (B, T', H) encoder output and its (B,) lengths."""
        # Augmentation and normalisation in fp32 whatever the autocast dtype, as funasr's models do.
        with torch.autocast(speech.device.type, enabled=False):
            if self.specaug is not None and self.training:
                speech, speech_lengths = self.specaug(speech, speech_lengths)
            if self.normalize is not None:
                # funasr's normalisers work in place on tensors without grad: keep the caller's intact.
                speech, speech_lengths = self.normalize(speech.clone(), speech_lengths)
        encoder_out, encoder_out_lens = self.encoder(speech, speech_lengths)[:2]
        if isinstance(encoder_out, tuple):  # intermediate CTC outputs: not used here
            encoder_out = encoder_out[0]
        return encoder_out, encoder_out_lens

    def forward(self, speech: torch.Tensor, speech_lengths: torch.Tensor, text: torch.Tensor,
                text_lengths: torch.Tensor, **kwargs: Any) -> tuple[torch.Tensor, dict, torch.Tensor]:
        """CTC loss of a padded batch: (loss, stats, weight) as funasr's trainer expects."""
        if text_lengths.dim() > 1:
            text_lengths = text_lengths[:, 0]
        if speech_lengths.dim() > 1:
            speech_lengths = speech_lengths[:, 0]
        encoder_out, encoder_out_lens = self.encode(speech, speech_lengths)
        loss = self.ctc(encoder_out, encoder_out_lens, text, text_lengths)
        stats = {"loss_ctc": loss.detach(), "loss": loss.detach().clone()}
        if not self.training:  # validation: greedy token error rate, cheap next to the encoder
            hyps = self.greedy_search(self.ctc.log_softmax(encoder_out), encoder_out_lens)
            refs = [t[:n].tolist() for t, n in zip(text, text_lengths.tolist(), strict=True)]
            errors = sum(edit_distance(r, h) for r, h in zip(refs, hyps, strict=True))
            stats["cer_ctc"] = torch.tensor(errors / max(1, sum(map(len, refs))))
        weight = int((text_lengths + 1).sum()) if self.length_normalized_loss else speech.shape[0]
        return force_gatherable((loss, stats, weight), loss.device)

    def greedy_search(self, log_probs: torch.Tensor, lengths: torch.Tensor) -> list[list[int]]:
        """Best path of each utterance: argmax per frame, repeats collapsed, blanks dropped."""
        hyps = []
        for best, n in zip(log_probs.argmax(dim=-1), lengths.tolist(), strict=True):
            best = torch.unique_consecutive(best[:n])
            hyps.append(best[best != self.blank_id].tolist())
        return hyps

    @torch.no_grad()
    def inference(self, data_in: Any, data_lengths: Any = None, key: list | None = None,
                  tokenizer: Any = None, frontend: Any = None, **kwargs: Any) -> tuple[list[dict], dict]:
        """Greedy CTC decoding, called by ``AutoModel.generate``: wav paths, waveforms or fbank in,
        ``([{"key", "text", "token_int"}, ...], meta_data)`` out, one result per input."""
        meta_data = {}
        data_type = kwargs.get("data_type", "sound")
        if isinstance(data_in, torch.Tensor) and data_type == "fbank":
            speech = data_in if data_in.dim() == 3 else data_in[None]
            speech_lengths = (torch.full((speech.shape[0],), speech.shape[1]) if data_lengths is None
                              else torch.as_tensor(data_lengths).reshape(-1))
        else:
            time1 = time.perf_counter()
            audio = load_audio_text_image_video(data_in, fs=frontend.fs, audio_fs=kwargs.get("fs", 16000),
                                                data_type=data_type, tokenizer=tokenizer)
            time2 = time.perf_counter()
            speech, speech_lengths = extract_fbank(audio, data_type=data_type, frontend=frontend)
            meta_data["load_data"] = f"{time2 - time1:0.3f}"
            meta_data["extract_feat"] = f"{time.perf_counter() - time2:0.3f}"
            meta_data["batch_data_time"] = (speech_lengths.sum().item() * frontend.frame_shift
                                            * frontend.lfr_n / 1000)
        device = kwargs.get("device") or next(self.parameters()).device
        encoder_out, encoder_out_lens = self.encode(speech.to(device), speech_lengths.to(device))
        hyps = self.greedy_search(self.ctc.log_softmax(encoder_out), encoder_out_lens)

        keys = list(key[0] if key and isinstance(key[0], (list, tuple)) else key or [])
        keys += [f"utt{i}" for i in range(len(keys), len(hyps))]
        results = [{"key": k, "text": tokenizer.decode(ids), "token_int": ids}
                   for k, ids in zip(keys, hyps, strict=False)]
        if kwargs.get("output_dir") is not None:
            if not hasattr(self, "writer"):
                self.writer = DatadirWriter(kwargs["output_dir"])
            for r in results:
                self.writer["1best_recog"]["text"][r["key"]] = r["text"]
                self.writer["1best_recog"]["token_int"][r["key"]] = " ".join(map(str, r["token_int"]))
        return results, meta_data

    def export(self, **kwargs: Any) -> ConformerCTCExport:
        """The module to hand to ``torch.onnx.export(..., dynamo=False)`` or funasr's export utility."""
        return ConformerCTCExport(self, **kwargs)


class ConformerCTCExport(torch.nn.Module):
    """Inference graph for ONNX: features (B, T, D) and lengths (B,) -> CTC log-probs (B, T', V) and
    their lengths (B,), with batch and time dynamic.

    funasr's encoders and normalisers build their padding masks with ``lengths.tolist()``, which tracing
    freezes to the dummy input's lengths. This forward builds the same masks from tensors and runs the
    encoder's own submodules (input layer, blocks, final norm) with them; no weight is copied. SpecAug
    is training-only and is left out. The relative positional table is a constant of the graph, sized
    as in PyTorch: up to 5000 frames after subsampling (200 s with conv2d's 40 ms frames).
    """

    def __init__(self, model: ConformerCTC, **kwargs: Any) -> None:
        super().__init__()
        enc = model.encoder
        if not all(hasattr(enc, a) for a in ("embed", "encoders", "normalize_before")):
            raise BadInputError(f"ONNX export of {type(enc).__name__}: only encoders built like "
                                "ConformerEncoder/TransformerEncoder (embed, encoders, after_norm)")
        if getattr(enc, "interctc_layer_idx", None):
            raise BadInputError("ONNX export with intermediate CTC layers")
        norm = model.normalize
        if norm is not None and not (isinstance(norm, UtteranceMVN) and not norm.norm_vars):
            raise BadInputError(f"ONNX export with normalize {norm!r}: only UtteranceMVN "
                                "(norm_vars: false) is traced; global CMVN belongs in the frontend")
        self.encoder = enc
        self.ctc_lo = model.ctc.ctc_lo
        self.norm_means = norm is not None and norm.norm_means
        self.input_size = model.input_size

    def forward(self, speech: torch.Tensor,
                speech_lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(log_probs, encoder_out_lens) of a padded batch, as ``ConformerCTC.encode`` + log-softmax."""
        valid = torch.arange(speech.shape[1], device=speech.device)[None, :] < speech_lengths[:, None]
        if self.norm_means:  # UtteranceMVN: zero the padding, subtract the mean of the valid frames
            speech = speech.masked_fill(~valid[:, :, None], 0.0)
            speech = speech - speech.sum(dim=1, keepdim=True) / speech_lengths.to(speech.dtype)[:, None, None]
        masks = valid[:, None, :]
        if isinstance(self.encoder.embed, _SUBSAMPLING):
            x, masks = self.encoder.embed(speech, masks)
        else:
            x = self.encoder.embed(speech)
        x, masks = self.encoder.encoders(x, masks)
        if isinstance(x, tuple):  # (x, relative positional embedding)
            x = x[0]
        if self.encoder.normalize_before:
            x = self.encoder.after_norm(x)
        return torch.log_softmax(self.ctc_lo(x), dim=-1), masks.squeeze(1).sum(dim=1)

    def export_dummy_inputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Two utterances of different lengths, so that tracing sees real padding."""
        return torch.randn(2, 64, self.input_size), torch.tensor([64, 41], dtype=torch.int32)

    def export_input_names(self) -> list[str]:
        return ["speech", "speech_lengths"]

    def export_output_names(self) -> list[str]:
        return ["log_probs", "encoder_out_lens"]

    def export_dynamic_axes(self) -> dict[str, dict[int, str]]:
        return {"speech": {0: "batch_size", 1: "feats_length"}, "speech_lengths": {0: "batch_size"},
                "log_probs": {0: "batch_size", 1: "logits_length"}, "encoder_out_lens": {0: "batch_size"}}

    def export_name(self) -> str:
        return "model.onnx"
