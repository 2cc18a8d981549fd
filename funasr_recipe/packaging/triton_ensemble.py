"""Stage 5's Triton model repositories: the exported encoder (onnxruntime backend) and, around it, an
ensemble that takes waveforms and returns text, laid out as FunASR's runtime/triton_gpu does
(feature_extractor -> encoder -> scoring), with the recipe's own features and decoding.

Reads the package's onnx/ (model.onnx, model_quant.onnx, config.yaml, am.mvn, the tokenizer) and
triton_models/model.py (the python-backend models' source); writes, in the package:
  triton/                     the CPU-safe repository: ``tritonserver --model-repository triton`` starts
                              on a machine without a GPU
    <tag>/, <tag>_int8/       encoder fp32 (KIND_AUTO: GPU where there is one) and int8 (KIND_CPU):
                              config.pbtxt + 1/model.onnx, features in, scores out
    feature_extractor/        python backend: WAV -> features (config.pbtxt, 1/model.py, config.yaml,
                              am.mvn)
    ctc_decoder/              python backend: scores -> TEXT (config.pbtxt, 1/model.py, config.yaml,
     (paraformer_decoder/)    the tokenizer); Paraformer's rule is an argmax per predicted token, not CTC
    <tag>_asr/, <tag>_asr_int8/   ensembles: WAV -> feature_extractor -> encoder -> decoder -> TEXT
  triton_gpu/                 the GPU repository: the fp16-I/O encoder with onnxruntime's TensorRT
                              provider (KIND_GPU) and its own feature_extractor_fp16, <decoder>_fp16 and
                              <tag>_asr_fp16 (float16 features and scores between the steps)
A KIND_GPU model does not load where there is no GPU, and tritonserver then exits (--exit-on-error is on
by default): hence the fp16 model's own repository. Its models' names differ from triton/'s, so that a
GPU server can serve both: ``tritonserver --model-repository triton --model-repository triton_gpu``.

The python models find the recipe's sources in the package's runtime/ (parameter runtime_dir,
../../runtime from a model's folder): mount or copy the whole package, not triton/ alone, or install the
runtime's files on the server's PYTHONPATH. Their imports are part of what runtime/ ships
(packaging/package.py ``runtime_files``).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import onnx
import yaml
from onnx import TensorProto

from funasr_recipe.families.registry import family_spec
from funasr_recipe.packaging.triton_repo import (
    TRITON_TYPES,
    Step,
    Tensor,
    config_pbtxt,
    ensemble_pbtxt,
    fp16_io,
    onnx_io,
    python_pbtxt,
)
from funasr_recipe.runtime.onnx_asr import family_parts

PYTHON_MODEL = Path(__file__).resolve().with_name("triton_models") / "model.py"
RUNTIME_DIR = "../../runtime"  # from <repo>/<model>/ to the package's runtime/
FEATURE_INPUTS = ("speech", "speech_lengths")  # the encoder's inputs that the features fill
TAGS = ("LANGUAGE_TAG", "EMOTION_TAG", "EVENT_TAG")  # SenseVoice's ensemble outputs besides TEXT


@dataclass(frozen=True)
class Encoder:
    suffix: str  # of the encoder's name (<tag><suffix>) and its ensemble's (<tag>_asr<suffix>)
    variant: str  # what the card calls it
    kind: str  # Triton instance kind
    source: str | None  # the onnx/ file it is; None: fp16 I/O made from model.onnx


# repository -> its encoders; the first one's I/O sets the repository's feature extractor and decoder
ENCODERS = {"triton": (Encoder("", "fp32", "KIND_AUTO", "model.onnx"),
                       Encoder("_int8", "int8", "KIND_CPU", "model_quant.onnx")),
            "triton_gpu": (Encoder("_fp16", "fp16 I/O", "KIND_GPU", None),)}


def client_shape(t: Tensor) -> str:
    """A batched Triton tensor's shape as a client sends or receives it: batch first, [B, 1] for a
    per-utterance value (the config's dims [1])."""
    dims = [-1, *(-1 if d is None else d for d in t.dims[1:])] if t.batched else list(t.dims)
    return "[" + ", ".join(map(str, dims if len(dims) > 1 else [*dims, 1])) + "]"


def described(tensors: list[Tensor]) -> list[tuple[str, str, str]]:
    """(name, Triton type, client-side shape) of each tensor, for the card."""
    return [(t.name, TRITON_TYPES[t.elem_type], client_shape(t)) for t in tensors]


def per_utt(name: str, elem_type: int = TensorProto.INT32, optional: bool = False) -> Tensor:
    return Tensor(name, elem_type, (None, 1), optional)


class RepoWriter:
    """Writes one repository's models and remembers, for the card, what each is and which files it has."""

    def __init__(self, pkg: Path, repo: str, tag: str, family: str, max_batch: int) -> None:
        self.pkg, self.repo, self.tag, self.max_batch = pkg, repo, tag, max_batch
        self.onnx = pkg / "onnx"
        self.export = yaml.safe_load((self.onnx / "config.yaml").read_text(encoding="utf-8"))
        self.prompt = family_parts(family, self.export.get("model_conf") or {}).extra  # SenseVoice's ids
        self.decoder = family_spec(family).triton_decoder
        self.models: list[dict] = []
        self.files: dict[str, str] = {}

    def _write(self, model: str, config: str, role: str, what: str, kind: str, inputs: list[Tensor],
               outputs: list[Tensor], precision: str | None = None) -> None:
        path = self.pkg / self.repo / model / "config.pbtxt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(config, encoding="utf-8")
        self.files[f"{self.repo}/{model}/config.pbtxt"] = f"Triton configuration: {what}"
        self.models.append({"repo": self.repo, "name": model, "role": role, "what": what, "kind": kind,
                            "precision": precision, "max_batch": self.max_batch,
                            "inputs": described(inputs), "outputs": described(outputs)})

    def _asset(self, model: str, rel: str, source: Path, what: str) -> None:
        link_or_copy(source, self.pkg / self.repo / model / rel)
        self.files[f"{self.repo}/{model}/{rel}"] = what

    def encoder(self, enc: Encoder) -> tuple[list[Tensor], list[Tensor]]:
        name = self.tag + enc.suffix
        target = self.pkg / self.repo / name / "1" / "model.onnx"
        if enc.source:
            link_or_copy(self.onnx / enc.source, target)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            onnx.save(fp16_io(onnx.load(str(self.onnx / "model.onnx"))), str(target))
        inputs, outputs = onnx_io(target)
        extra = {t.name for t in inputs} - set(FEATURE_INPUTS)
        if extra != set(self.prompt):
            raise ValueError(f"{target}: inputs {sorted(t.name for t in inputs)}; the runtime's rule for "
                             f"this family fills {[*FEATURE_INPUTS, *self.prompt]}")
        self.files[f"{self.repo}/{name}/1/model.onnx"] = f"Triton model file, encoder {enc.variant}"
        self._write(name, config_pbtxt(name, inputs, outputs, self.max_batch, enc.kind,
                                       tensorrt_fp16=enc.source is None),
                    "encoder", f"encoder {enc.variant}, features in", enc.kind, inputs, outputs, enc.variant)
        return inputs, outputs

    def feature_extractor(self, name: str, encoder_inputs: list[Tensor]) -> None:
        by_name = {t.name: t for t in encoder_inputs}
        inputs = [Tensor("wav", TensorProto.FLOAT, (None, None)), per_utt("wav_lens")]
        inputs += [per_utt(p, by_name[p].elem_type, optional=True) for p in self.prompt]
        outputs = [by_name["speech"], per_utt("speech_lengths", by_name["speech_lengths"].elem_type)]
        outputs += [per_utt(f"{p}_id", by_name[p].elem_type) for p in self.prompt]
        params = {"role": "feature_extractor", "config": "config.yaml", "cmvn": "am.mvn",
                  "runtime_dir": RUNTIME_DIR, **{f"default_{p}": str(v) for p, v in self.prompt.items()}}
        self._python(name, "feature_extractor", params, inputs, outputs,
                     "python backend, waveforms -> features")
        self._asset(name, "config.yaml", self.onnx / "config.yaml", "the export's config (frontend_conf)")
        self._asset(name, "am.mvn", self.onnx / "am.mvn", "global CMVN of the LFR features")

    def decoder_model(self, name: str, encoder_outputs: list[Tensor]) -> list[Tensor]:
        scores, lengths = encoder_outputs[:2]
        outputs = [per_utt("text", TensorProto.STRING)]
        outputs += [per_utt(t.lower(), TensorProto.STRING) for t in TAGS if self.prompt]
        params = {"role": "decoder", "config": "config.yaml", "runtime_dir": RUNTIME_DIR}
        self._python(name, "decoder", params, [scores, per_utt(lengths.name, lengths.elem_type)], outputs,
                     "python backend, scores -> text")
        self._asset(name, "config.yaml", self.onnx / "config.yaml", "the export's config (model_conf)")
        bpemodel = (self.export.get("tokenizer_conf") or {}).get("bpemodel")
        tokenizer = Path(bpemodel).name if bpemodel else "tokens.json"
        self._asset(name, tokenizer, self.onnx / tokenizer, "the tokenizer the decoder detokenises with")
        return outputs

    def _python(self, name: str, role: str, params: dict[str, str], inputs: list[Tensor],
                outputs: list[Tensor], what: str) -> None:
        self._write(name, python_pbtxt(name, inputs, outputs, self.max_batch, params), role, what,
                    "KIND_CPU", inputs, outputs)
        self._asset(name, "1/model.py", PYTHON_MODEL, f"Triton python model ({name}): "
                    "funasr_recipe/packaging/triton_models/model.py")

    def ensemble(self, enc: Encoder, feature_extractor: str, decoder: str,
                 encoder_io: tuple[list[Tensor], list[Tensor]], decoder_outputs: list[Tensor]) -> None:
        name, prompt = f"{self.tag}_asr{enc.suffix}", list(self.prompt)
        scores, lengths = encoder_io[1][:2]
        inputs = [Tensor("WAV", TensorProto.FLOAT, (None, None)), per_utt("WAV_LENS")]
        inputs += [per_utt(p.upper(), optional=True) for p in prompt]
        outputs = [Tensor(t.name.upper(), t.elem_type, t.dims) for t in decoder_outputs]
        ids = {p: f"{p.upper()}_ID" for p in prompt}  # the prompt, defaults filled in
        features = {"speech": "SPEECH", "speech_lengths": "SPEECH_LENGTHS"}
        found = {scores.name: "SCORES", lengths.name: "SCORE_LENGTHS"}
        audio = {"wav": "WAV", "wav_lens": "WAV_LENS"} | {p: p.upper() for p in prompt}
        steps = [Step(feature_extractor, audio, features | {f"{p}_id": v for p, v in ids.items()}),
                 Step(self.tag + enc.suffix, features | ids, found),
                 Step(decoder, found, {t.name: t.name.upper() for t in decoder_outputs})]
        self._write(name, ensemble_pbtxt(name, inputs, outputs, self.max_batch, steps), "ensemble",
                    f"ensemble, waveforms -> text, encoder {enc.variant}", "ensemble", inputs, outputs,
                    enc.variant)
        (self.pkg / self.repo / name / "1").mkdir(exist_ok=True)  # Triton wants a version folder, even empty


def write_repositories(pkg: Path, tag: str, family: str, max_batch: int) -> tuple[list[dict], dict[str, str]]:
    """triton/ and triton_gpu/ (module docstring); returns what the card says of each model and the files
    written (package path -> what it is)."""
    models, files = [], {}
    for repo, variants in ENCODERS.items():
        writer = RepoWriter(pkg, repo, tag, family, max_batch)
        first = variants[0]
        feature_extractor, decoder = f"feature_extractor{first.suffix}", f"{writer.decoder}{first.suffix}"
        shared = writer.encoder(first)
        writer.feature_extractor(feature_extractor, shared[0])
        decoder_outputs = writer.decoder_model(decoder, shared[1])
        for enc in variants:
            encoder_io = shared if enc is first else writer.encoder(enc)
            if encoder_io != shared:  # one feature extractor and decoder serve the repository's encoders
                raise ValueError(f"{repo}: encoder {enc.variant} has other inputs/outputs than "
                                 f"{first.variant}: {encoder_io} != {shared}")
            writer.ensemble(enc, feature_extractor, decoder, encoder_io, decoder_outputs)
        models += writer.models
        files |= writer.files
    return models, files


def link_or_copy(src: Path, dst: Path) -> None:
    """A hard link (one copy on disk and in the tarball), or a copy across filesystems."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)
