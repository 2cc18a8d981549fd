"""The tokenizer class of a from-scratch SenseVoice (``tokenizer: SenseVoiceTagTokenizer`` in a config).

Reads the sentencepiece model named by ``tokenizer_conf.bpemodel`` (the ``sensevoice`` kind of
model/tokenizer.py); writes nothing.

Why the recipe has its own class: funasr's SenseVoiceCTCDataset encodes the transcript and each of the
four tags separately with ``tokenizer.encode``, which funasr's SentencepiecesTokenizer hands to
sentencepiece whole. A sentencepiece model without the dummy prefix then gives a tag one token, but
learns every word twice ("ZERO" first in a line, "▁ZERO" after a space) and a CTC model trained on it
emits "ZERO" where a word boundary belongs ("NINE ZERO" decodes to "NINEZERO"). With the dummy prefix
every word starts with "▁", but a tag alone becomes two tokens ("▁", "<|en|>"), or one unknown one in a
word model, where the unmodified SenseVoiceSmall reads exactly one id. This class, on a model trained
with the dummy prefix, cuts the line at its tags: each tag that is a piece of the vocabulary is its own
id, and each stretch of text between them is encoded by sentencepiece (so it starts with "▁").
Decoding is sentencepiece's own, as in every runtime (funasr-onnx's DecodeIds, sherpa-onnx's
tokens.txt), so that PyTorch and ONNX agree on the text; the text after the tags then starts with a
space, which data/tags.py ``split_tags``/``strip_tags`` drop.

Importing this module registers the class; model/trainer.py, model/model_dir.py and local/compute_fbank.py
import it before funasr builds a tokenizer from a config (stage 1's checks, training, AutoModel).

  import funasr_recipe.model.sensevoice_tokenizer  # noqa: F401  (registers SenseVoiceTagTokenizer)
  tok = SenseVoiceTagTokenizer(bpemodel="dump/tokenizer/tiny_sensevoice/chn_jpn_yue_eng_ko_spectok.bpe.model")
  tok.encode("<|en|>") == [24885];  tok.text2tokens("NINE ZERO") == ["▁NINE", "▁ZERO"]
"""

from __future__ import annotations

from typing import Any

from funasr.register import tables
from funasr.tokenizer.sentencepiece_tokenizer import SentencepiecesTokenizer

from funasr_recipe.data.tags import TAG
from funasr_recipe.model.sensevoice_vocab import SENSEVOICE_TOKENIZER


@tables.register("tokenizer_classes", SENSEVOICE_TOKENIZER)
class SenseVoiceTagTokenizer(SentencepiecesTokenizer):
    """funasr's SentencepiecesTokenizer, except that ``encode`` gives every tag of the vocabulary its one
    id and encodes the text around the tags on its own (with the model's dummy prefix)."""

    def encode(self, line: Any, **kwargs: Any) -> list:
        """Token ids of ``line``; a list of strings (funasr's tokens2ids) goes to sentencepiece as before."""
        if not isinstance(line, str):
            return super().encode(line, **kwargs)
        self._build_sentence_piece_processor()
        ids: list[int] = []
        start = 0
        for match in TAG.finditer(line):
            tag = match.group(0)
            tag_id = self.sp.PieceToId(tag)
            if self.sp.IdToPiece(tag_id) != tag:  # not in the vocabulary (PieceToId gave <unk>): text
                continue
            ids += self._text(line[start:match.start()])
            ids.append(tag_id)
            start = match.end()
        return ids + self._text(line[start:])

    def text2tokens(self, line: str) -> list[str]:
        """The pieces ``encode`` gives: funasr's SenseVoice timestamps take the 4 tags off the front."""
        return [self.sp.IdToPiece(i) for i in self.encode(line)]

    def tokens2ids(self, tokens: list[str]) -> list[list[int]]:
        """One ``[id]`` per piece, the shape funasr's SenseVoice timestamps read. The base class encodes
        each piece as text, and the dummy prefix would put a "▁" before "▁NINE"."""
        self._build_sentence_piece_processor()
        return [[self.sp.PieceToId(t)] for t in tokens]

    def _text(self, text: str) -> list[int]:
        # Whitespace between two tags is no word: sentencepiece would give it a lone "▁".
        return self.sp.EncodeAsIds(text) if text.strip() else []
