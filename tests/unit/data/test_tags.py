"""data/tags.py: SenseVoice's tags from the names and codes corpora use for languages."""

from __future__ import annotations

import pytest

from funasr_recipe.data.tags import canonical_tag, valid_names


@pytest.mark.parametrize(("given", "tag"), [
    ("en", "<|en|>"), ("<|zh|>", "<|zh|>"), ("English", "<|en|>"), ("en-US", "<|en|>"), ("en_GB", "<|en|>"),
    ("zh-CN", "<|zh|>"), ("zh-TW", "<|zh|>"), ("cmn-Hans-CN", "<|zh|>"), ("Mandarin", "<|zh|>"),
    ("Cantonese", "<|yue|>"), ("zh-HK", "<|yue|>"), ("yue-Hant-HK", "<|yue|>"), ("ja-JP", "<|ja|>"),
    ("Japanese", "<|ja|>"), ("KO", "<|ko|>"), ("kor", "<|ko|>"), ("nospeech", "<|nospeech|>"),
    ("French", None), ("fr-FR", None), ("", None),
])
def test_language_names_and_codes(given: str, tag: str | None) -> None:
    assert canonical_tag("language", given) == tag


def test_names_are_for_languages_only_and_errors_list_the_codes() -> None:
    assert canonical_tag("emotion", "English") is None and canonical_tag("emotion", "happy") == "<|HAPPY|>"
    assert "zh, en, yue, ja, ko, nospeech" in valid_names("language") and "en-US" in valid_names("language")
    assert valid_names("event").startswith("valid event tags: Speech, BGM")
