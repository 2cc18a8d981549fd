"""The library beneath the recipe's stage programs (``local/``) and corpus recipes (``recipes/``).

Sub-packages by concern, each importing only from those before it in this list (tests/unit/repo/test_style.py
checks it from the imports):

  core      logging with node and rank, the command-line conventions (exit codes, options), rejections
  families  the model families, one spec each, read by every layer that differs per family
  dist      work split over every process of every node, ``.done`` markers and fingerprints, node check-in,
            the preflight across nodes
  features  audio I/O, the fbank kernel, LFR and CMVN, stage 1's feature shards
  data      Kaldi tables, SenseVoice tags, stage 0's validation and manifest, batching, funasr datasets
  model     config reading, tokenizers, the recipe's model classes, checkpoints and model dirs, training
  scoring   error rates, decode dirs, scores and result tables
  runtime   ONNX export, the one ONNX inference path, parity with PyTorch, the runtime benchmark
  reports   training curves
  packaging the deployable package, its model card, the Triton repository
  serving   the HTTP service (stage 6)

Every ``__init__`` is a docstring only: importing a module pulls in nothing it does not use (the package's
runtime ships a subset of these files).
"""
