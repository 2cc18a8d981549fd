"""Stage 6: serve an exported model over HTTP (FastAPI + uvicorn) on the recipe's ONNX runtime.

Reads  <model-dir>, an export dir (stage 4's exp/<tag>/export, or a package's onnx/); serves until
       stopped (Ctrl-C / SIGTERM): POST /v1/transcriptions, POST /v1/audio/transcriptions (OpenAI's
       form), GET / (a web page), GET /health, GET /metrics. funasr_recipe/serving/app.py has the API,
       funasr_recipe/serving/cli.py the options (the program lives there, so that a package ships it).
Writes nothing but its log.

  .venv/bin/python -m local.serve --model-dir exp/tiny_sensevoice/export [--port 8000] [--precision int8]
  curl -F file=@corpora/free-spoken-digit-dataset/recordings/7_jackson_0.wav \\
      http://127.0.0.1:8000/v1/transcriptions
"""

from __future__ import annotations

import sys

from funasr_recipe.serving.cli import build_parser, main

__all__ = ["build_parser", "main"]  # build_parser: the options, for the docs' reference

if __name__ == "__main__":
    sys.exit(main())
