"""Triton python-backend models of the audio ensemble (packaging/triton_ensemble.py writes their configs
and copies this file to <repo>/<model>/1/model.py): the config's "role" parameter picks one.

  feature_extractor  waveforms -> the model's input features, exactly as the recipe's runtime computes
                     them (runtime/onnx_asr.py OnnxASR.features): Kaldi fbank as funasr's WavFrontend
                     (features/fbank.py), LFR stacking, global CMVN (features/cmvn.py)
  decoder            the encoder's scores -> text by the family's rule, as OnnxASR decodes: greedy CTC
                     (SenseVoiceSmall, ConformerCTC) or Paraformer's argmax per predicted token, then the
                     tokenizer; SenseVoice's tags also come out one by one

Reads, relative to the model's folder <repo>/<model>/ (the config's parameters name the files): the
export's config.yaml, am.mvn (feature_extractor), the sentencepiece model or tokens.json (decoder), and
``runtime_dir`` (../../runtime: the package's runtime/, the recipe's sources), which goes first on
sys.path; an installed funasr_recipe serves where that folder is absent (the repository copied alone).

Per request, batch B first (the client-side shapes are in the model card):
  feature_extractor  wav (B, N) float32 mono in [-1, 1] at the model's rate, zero-padded; wav_lens (B, 1)
                     int32 true samples per row; SenseVoice: optional language/textnorm (B, 1) int32 ids
                     -> speech (B, T, dim) zero-padded (float16 where the config says TYPE_FP16, for the
                     fp16 encoder), speech_lengths (B, 1) int32, language_id/textnorm_id (B, 1) int32
                     (a request's own ids, else the defaults of the config)
  decoder            scores (B, T', V) and valid lengths (B, 1), named as the encoder's outputs
                     -> text (B, 1) string (tags kept, as OnnxASR returns it); SenseVoice: language_tag,
                     emotion_tag, event_tag (B, 1) string (bare names, "" where the text has none)
A request that fails gets its own error response; the others in the same call are answered.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils
import yaml

MODEL_DIR = Path(__file__).resolve().parents[1]  # <repo>/<model>/, above the version folder 1/
TAG_OUTPUTS = {"language_tag": "language", "emotion_tag": "emotion", "event_tag": "event"}


def parameter(config: dict, key: str) -> str:
    return config["parameters"][key]["string_value"]


def runtime_on_path(config: dict) -> None:
    """The package's runtime/ first on sys.path, so that the recipe's modules import from it."""
    runtime = (MODEL_DIR / parameter(config, "runtime_dir")).resolve()
    if runtime.is_dir() and str(runtime) not in sys.path:
        sys.path.insert(0, str(runtime))


def export_config(config: dict) -> dict:
    return yaml.safe_load((MODEL_DIR / parameter(config, "config")).read_text(encoding="utf-8"))


def output_dtype(config: dict, name: str) -> type:
    """The numpy type of one of the config's outputs (fp32 or fp16 features, int32 lengths, ...)."""
    return pb_utils.triton_string_to_numpy(pb_utils.get_output_config_by_name(config, name)["data_type"])


def strings(values: list[str]) -> np.ndarray:
    """(B, 1) TYPE_STRING tensor data: UTF-8 bytes in an object array."""
    return np.array([[v.encode("utf-8")] for v in values], dtype=np.object_)


class FeatureExtractor:
    def __init__(self, config: dict) -> None:
        from funasr_recipe.features.cmvn import lfr, read_am_mvn
        from funasr_recipe.features.fbank_conf import FbankConf
        from funasr_recipe.features.numpy_fbank import NumpyFbank

        self.conf = FbankConf.from_frontend_conf(export_config(config).get("frontend_conf") or {})
        self.extractor = NumpyFbank(self.conf)
        self.lfr = lfr
        self.shift, self.scale = read_am_mvn(MODEL_DIR / parameter(config, "cmvn"))
        self.types = {t["name"]: output_dtype(config, t["name"]) for t in config["output"]}
        self.prompt = {name: int(parameter(config, f"default_{name}")) for name in ("language", "textnorm")
                       if f"{name}_id" in self.types}

    def features(self, waves: list[np.ndarray]) -> list[np.ndarray]:
        """Model input of mono clips at the model's rate, as OnnxASR.features computes it (one batched
        fbank call: from_waves gives each clip from_wave's values exactly)."""
        out = []
        for fbank in self.extractor.from_waves([(w, self.conf.fs) for w in waves]):
            feats = self.lfr(fbank, self.conf.lfr_m, self.conf.lfr_n) + self.shift
            feats *= self.scale
            out.append(feats)
        return out

    def __call__(self, request: object) -> list:
        wav = pb_utils.get_input_tensor_by_name(request, "wav").as_numpy()
        lens = pb_utils.get_input_tensor_by_name(request, "wav_lens").as_numpy().reshape(-1)
        if wav.ndim != 2 or len(lens) != len(wav) or (lens < 0).any() or (lens > wav.shape[1]).any():
            raise ValueError(f"wav {list(wav.shape)} with wav_lens {lens.tolist()}: one length per row, "
                             "each at most the row's samples")
        feats = self.features([np.ascontiguousarray(w[:n], dtype=np.float32)
                               for w, n in zip(wav, lens.tolist(), strict=True)])
        lengths = np.array([[len(f)] for f in feats], dtype=self.types["speech_lengths"])
        speech = np.zeros((len(feats), int(lengths.max(initial=0)), len(self.shift)),
                          dtype=self.types["speech"])
        for i, f in enumerate(feats):
            speech[i, : len(f)] = f
        outputs = [pb_utils.Tensor("speech", speech), pb_utils.Tensor("speech_lengths", lengths)]
        for name, default in self.prompt.items():
            given = pb_utils.get_input_tensor_by_name(request, name)
            ids = np.full((len(wav), 1), default) if given is None else given.as_numpy().reshape(len(wav), 1)
            outputs.append(pb_utils.Tensor(f"{name}_id", ids.astype(self.types[f"{name}_id"])))
        return outputs


class Decoder:
    def __init__(self, config: dict) -> None:
        from funasr_recipe.data.tags import split_tags
        from funasr_recipe.runtime.onnx_asr import _Detokenizer, export_family, family_parts

        export = export_config(config)
        self.parts = family_parts(export_family(MODEL_DIR, export), export.get("model_conf") or {})
        self.detokenize = _Detokenizer(MODEL_DIR, export)  # its tokenizer files lie beside config.yaml
        self.split_tags = split_tags
        self.scores, self.lengths = (t["name"] for t in config["input"])
        self.tags = [t["name"] for t in config["output"] if t["name"] in TAG_OUTPUTS]

    def __call__(self, request: object) -> list:
        scores = pb_utils.get_input_tensor_by_name(request, self.scores).as_numpy()
        lengths = pb_utils.get_input_tensor_by_name(request, self.lengths).as_numpy().reshape(-1)
        best = scores.argmax(axis=-1)  # one pass over the (B, T', V) scores, as OnnxASR._texts
        texts = [self.detokenize(self.parts.token_ids(b[:n])) for b, n in zip(best, lengths.tolist(),
                                                                              strict=True)]
        outputs = [pb_utils.Tensor("text", strings(texts))]
        found = [self.split_tags(t)[0] for t in texts]
        outputs += [pb_utils.Tensor(name, strings([f.get(TAG_OUTPUTS[name], "") for f in found]))
                    for name in self.tags]
        return outputs


ROLES = {"feature_extractor": FeatureExtractor, "decoder": Decoder}


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        runtime_on_path(config)
        self.role = ROLES[parameter(config, "role")](config)

    def execute(self, requests: list) -> list:
        responses = []
        for request in requests:
            try:
                responses.append(pb_utils.InferenceResponse(output_tensors=self.role(request)))
            except Exception as e:  # whatever it is goes back to that request's client alone
                responses.append(pb_utils.InferenceResponse(output_tensors=[],
                                                            error=pb_utils.TritonError(str(e))))
        return responses
