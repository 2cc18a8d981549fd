"""The runtime's joining of character tokens against funasr-onnx's ``sentence_postprocess``."""

from __future__ import annotations

import random

import pytest
from funasr_onnx.utils.postprocess_utils import sentence_postprocess

from funasr_recipe.runtime.char_tokens import join_char_tokens

# CJK characters, digits, letters, BPE pieces, apostrophes, funasr's markers: every branch of its rule.
POOL = ["你", "好", "世", "界", "中国", "12", "3", "a", "b", "c", "x", "I", "Z", "abc", "it's", "'",
        "hel@@", "lo", "wor@@", "ld", "e@@", "<s>", "</s>", "<unk>"]


@pytest.mark.parametrize("seed", range(4))
def test_equals_funasr_onnx_on_generated_token_lists(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(2000):
        tokens = [rng.choice(POOL) for _ in range(rng.randint(0, 12))]
        assert join_char_tokens(tokens) == sentence_postprocess(list(tokens))[0], tokens


@pytest.mark.parametrize("tokens,text", [
    (["<s>", "你", "好", "</s>"], "你好"),
    (["hel@@", "lo", "wor@@", "ld"], "hello world"),
    (["a", "b", "c", "ok"], "ABC ok"),
    (["你", "好", "hel@@", "lo", "a", "b"], "你好hello AB"),
    (["hel@@", "lo", "你"], "hello你"),
])
def test_known_transcripts(tokens: list[str], text: str) -> None:
    assert join_char_tokens(tokens) == text == sentence_postprocess(list(tokens))[0]


def test_a_token_funasr_rejects_is_kept_rather_than_failing_the_request() -> None:
    tokens = ["你", ",", "好"]
    with pytest.raises(ValueError):
        sentence_postprocess(list(tokens))
    assert join_char_tokens(tokens) == "你,好"
