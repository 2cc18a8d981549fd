"""The model families, one spec each: every layer that behaves differently per family reads it here.

A family is a funasr model class (a config's ``model:``). What differs between families is data, not
code paths chosen by comparing names: how the output is decoded (greedy CTC, or Paraformer's one row per
predicted token), how many output frames answer a prompt before the audio's, the prompt's language and
text-normalisation ids, the ONNX graph's input and output names, which runtimes load the export, the
Triton decoder model, and the released architecture of a pretrained model (model/released_configs/).
WeNet keeps the same facts in tables (wenet/utils/init_model.py). A new family is one spec here, one
conf/*.yaml and, if it has a released model, one released architecture.

SenseVoiceSmall's ids are funasr's own (``SenseVoiceSmall.__init__``'s lid_dict, lid_int_dict,
textnorm_dict, textnorm_int_dict; funasr-onnx and sherpa-onnx hard-code the same):
tests/unit/families/test_registry.py checks every spec against funasr's tables and export code.

Torch-free and funasr-free, so that the lowest layers may read it. Reads and writes nothing.

  spec = family_spec("Paraformer")
  spec.decoding, spec.onnx_outputs   # -> "paraformer", ("logits", "token_num")
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from funasr_recipe.core.rejections import BadInputError

CTC, PARAFORMER = "ctc", "paraformer"  # the decoding rules
# Runtimes that can load an export besides PyTorch: the recipe's own ONNX runtime (runtime/onnx_asr.py),
# funasr-onnx, sherpa-onnx's offline SenseVoice loader, and the Triton ensemble of the package.
RECIPE, FUNASR_ONNX, SHERPA_ONNX, TRITON = "recipe", "funasr_onnx", "sherpa_onnx", "triton"


def _frozen(d: dict) -> Mapping:
    return MappingProxyType(dict(d))


@dataclass(frozen=True)
class FamilySpec:
    """What one model family is, for every layer (module docstring)."""

    name: str  # funasr's model class name, a config's ``model:``
    decoding: str  # CTC or PARAFORMER
    prompt_frames: int = 0  # output frames before the audio's that answer the prompt (language, ...)
    language_ids: Mapping[str, int] = field(default_factory=lambda: _frozen({}))  # prompt language -> id
    language_token_ids: Mapping[int, int] = field(default_factory=lambda: _frozen({}))  # tag token -> id
    textnorm_ids: Mapping[str, int] = field(default_factory=lambda: _frozen({}))  # woitn/withitn -> id
    textnorm_token_ids: Mapping[int, int] = field(default_factory=lambda: _frozen({}))
    onnx_inputs: tuple[str, ...] = ("speech", "speech_lengths")
    onnx_outputs: tuple[str, ...] = ("log_probs", "encoder_out_lens")
    runtimes: frozenset[str] = frozenset({RECIPE, TRITON})
    released: str | None = None  # model/released_configs/<released>.yaml: the hub model's architecture
    released_vocab_size: int | None = None  # its output layer's width (a model dir's tokenizer gives it)
    # The loss always includes CTC on the text tokens (SenseVoice takes its prompt frames off first):
    # stage 1 checks each transcript fits its audio's output frames.
    always_ctc: bool = False
    # The recipe's tokenizer kind for a from-scratch model whose class hard-codes token ids
    # (model/tokenizer.py).
    tokenizer_kind: str | None = None
    decoding_doc: str = ""  # how the ONNX outputs become tokens, for the model card

    @property
    def emits_tags(self) -> bool:
        """Whether its texts carry language/emotion/event/itn tags (``<|en|>...``): it has a prompt."""
        return self.prompt_frames > 0

    @property
    def ctc(self) -> bool:
        """Whether inference is greedy CTC over output frames (so frames give token times and scores)."""
        return self.decoding == CTC

    @property
    def extra_inputs(self) -> tuple[str, ...]:
        """The graph's per-utterance int32 inputs besides speech and speech_lengths."""
        return tuple(n for n in self.onnx_inputs if n not in ("speech", "speech_lengths"))

    @property
    def triton_decoder(self) -> str:
        """The Triton python model that turns the encoder's outputs into text."""
        return "paraformer_decoder" if self.decoding == PARAFORMER else "ctc_decoder"

    def prompt(self, language: str = "auto", textnorm: str = "woitn") -> dict[str, int]:
        """The graph's extra inputs for a prompt ({} for a family without one); BadInputError for a
        language or text normalisation the family does not know."""
        if not self.language_ids:
            return {}
        if language not in self.language_ids or textnorm not in self.textnorm_ids:
            raise BadInputError(f"{self.name} prompt {language!r}/{textnorm!r}: languages "
                                f"{sorted(self.language_ids)}, "
                                f"text normalisation {sorted(self.textnorm_ids)}")
        return {"language": self.language_ids[language], "textnorm": self.textnorm_ids[textnorm]}


SENSEVOICE = FamilySpec(
    name="SenseVoiceSmall", decoding=CTC, prompt_frames=4,
    language_ids=_frozen({"auto": 0, "zh": 3, "en": 4, "yue": 7, "ja": 11, "ko": 12, "nospeech": 13}),
    language_token_ids=_frozen({24884: 3, 24885: 4, 24888: 7, 24892: 11, 24896: 12, 24992: 13}),
    textnorm_ids=_frozen({"withitn": 14, "woitn": 15}),
    textnorm_token_ids=_frozen({25016: 14, 25017: 15}),
    onnx_inputs=("speech", "speech_lengths", "language", "textnorm"),
    onnx_outputs=("ctc_logits", "encoder_out_lens"),
    runtimes=frozenset({RECIPE, FUNASR_ONNX, SHERPA_ONNX, TRITON}),
    released="SenseVoiceSmall", released_vocab_size=25055, always_ctc=True, tokenizer_kind="sensevoice",
    decoding_doc="greedy CTC on ctc_logits (argmax per frame up to encoder_out_lens, repeats collapsed, "
                 "blank 0 dropped); inputs language and textnorm as above")
PARAFORMER_SPEC = FamilySpec(
    name="Paraformer", decoding=PARAFORMER, onnx_outputs=("logits", "token_num"),
    runtimes=frozenset({RECIPE, FUNASR_ONNX, TRITON}), released="Paraformer", released_vocab_size=8404,
    decoding_doc="the argmax of each of the first token_num rows of logits, ids 0, 1, 2 (blank, <s>, </s>) "
                 "dropped")
CONFORMER_CTC = FamilySpec(
    name="ConformerCTC", decoding=CTC, always_ctc=True,
    decoding_doc="greedy CTC on the log-probabilities (blank 0)")

FAMILIES: Mapping[str, FamilySpec] = _frozen({s.name: s for s in (SENSEVOICE, PARAFORMER_SPEC,
                                                                   CONFORMER_CTC)})


def family_spec(name: str | None, where: str = "") -> FamilySpec:
    """The spec of model class ``name``; BadInputError (naming ``where``) for a class the recipe cannot
    export and run (a Paraformer subclass such as BiCifParaformer exports another graph)."""
    spec = FAMILIES.get(name or "")
    if spec is None:
        raise BadInputError(f"{where + ': ' if where else ''}model {name!r}: the recipe's families are "
                            f"{', '.join(FAMILIES)}")
    return spec


def decoding_spec(name: str) -> FamilySpec:
    """The spec of ``name`` for decoding through funasr's AutoModel, which runs any model class: a class
    outside the families (a hub variant) decodes with no prompt, no tags, and CTC scores only where the
    model has a CTC head (model/inference.py looks)."""
    return FAMILIES.get(name) or FamilySpec(name=name, decoding=CTC, runtimes=frozenset())


def supporting(runtime: str) -> tuple[str, ...]:
    """The families whose exports ``runtime`` loads."""
    return tuple(n for n, s in FAMILIES.items() if runtime in s.runtimes)
