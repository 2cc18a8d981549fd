"""Corpus data: Kaldi tables, SenseVoice tags, stage 0's validation and manifest, batches, funasr datasets."""
