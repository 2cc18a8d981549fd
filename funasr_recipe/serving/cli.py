"""The HTTP service's command line (stage 6's program, local/serve.py, is this; a package's runtime/
ships it): serve an exported model over HTTP (FastAPI + uvicorn) on the recipe's ONNX runtime.

Reads  <model-dir>, an export dir (stage 4's exp/<tag>/export, or a package's onnx/); serves until
       stopped (Ctrl-C / SIGTERM): POST /v1/transcriptions, POST /v1/audio/transcriptions (OpenAI's
       form), GET / (a web page), GET /health, GET /metrics. funasr_recipe/serving/app.py has the API.
Writes nothing but its log.

  .venv/bin/python -m local.serve --model-dir exp/tiny_sensevoice/export [--port 8000] [--precision int8]
  PYTHONPATH=runtime python -m funasr_recipe.serving.cli --model-dir onnx     # in a stage-5 package
  curl -F file=@corpora/free-spoken-digit-dataset/recordings/7_jackson_0.wav \\
      http://127.0.0.1:8000/v1/transcriptions
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import fields
from pathlib import Path

from funasr_recipe.core.cli import EXIT_BAD_INPUT, program_parser, run_main
from funasr_recipe.core.env import available_cores
from funasr_recipe.core.log import setup_logging
from funasr_recipe.runtime.onnx_asr import OnnxASR
from funasr_recipe.serving.app import ServeSettings, create_app
from funasr_recipe.serving.guard import API_KEY_ENV, API_KEY_FILE_ENV, load_api_keys
from funasr_recipe.serving.protocol import guarded_protocol

log = logging.getLogger(__name__)
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    int8 = args.precision == "int8"
    for name in ("config.yaml", "am.mvn", "model_quant.onnx" if int8 else "model.onnx"):
        if not (args.model_dir / name).is_file():
            log.error("%s: no %s; give an export dir (stage 4's exp/<tag>/export, run ./run.sh --stage 4 "
                      "--stop-stage 4 first) or a package's onnx/", args.model_dir, name)
            return EXIT_BAD_INPUT
    settings = ServeSettings(**{f.name: getattr(args, f.name) for f in fields(ServeSettings)})
    settings.check()  # before the model loads: a bad combination is refused in a second
    keys = load_api_keys(args.api_key_file)
    if not keys and args.host not in LOOPBACK:
        log.warning("serving on %s without an API key: anyone who reaches the port can use it "
                    "(--api-key-file FILE, or $%s)", args.host, API_KEY_ENV)
    asr = OnnxASR(args.model_dir, quantize=int8, threads=args.threads)
    app = create_app(asr, settings, args.name, keys)
    log.info("serving %s (%s, %s) on http://%s:%d: max batch %d, max wait %g ms, queue %d, %s",
             args.model_dir, asr.family, asr.model_file.name, args.host, args.port, settings.max_batch,
             settings.max_wait_ms, settings.queue_size,
             f"{len(keys)} API key(s)" if keys else "no API key")
    errors = app.state.metrics.errors
    http = guarded_protocol(settings.header_timeout_s, settings.max_connections,
                            lambda reason: errors.labels(reason).inc())
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=10,
                http=http, timeout_keep_alive=5)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The service's options (its --help; the docs' reference is made from it)."""
    # No abbreviations: "--api-key KEY" must be an error, not --api-key-file naming a file "KEY".
    parser = program_parser(__doc__, allow_abbrev=False)
    parser.add_argument("--model-dir", type=Path, required=True,
                        help="export dir (stage 4) or a package's onnx/")
    parser.add_argument("--host", default="127.0.0.1", help="0.0.0.0 to serve other machines")
    parser.add_argument("--port", type=int, default=8000, help="TCP port")
    parser.add_argument("--precision", choices=("fp32", "int8"), default="fp32",
                        help="fp32: model.onnx; int8: model_quant.onnx")
    parser.add_argument("--threads", type=int, default=available_cores(),
                        help="onnxruntime threads (default: the cores this process may use)")
    parser.add_argument("--name", default=None, help="model name in /health, /v1/models and OpenAI "
                        "answers (default: export.json's name, the experiment's tag)")
    parser.add_argument("--api-key-file", type=Path, default=None,
                        help=f"file of accepted API keys, one per line; clients send 'Authorization: Bearer "
                        f"<key>'. Else ${API_KEY_ENV} (the key) or ${API_KEY_FILE_ENV} (a file); never the "
                        "key itself on the command line, where ps shows it")
    for f in fields(ServeSettings):  # every setting an option, its help in ServeSettings
        parser.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, type=type(f.default),
                            default=f.default, help=f.metadata["help"])
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging()
    log.info("Stage 6: serving: %s -> http://%s:%d", args.model_dir, args.host, args.port)
    return run_main(lambda: serve(args), log)


if __name__ == "__main__":
    sys.exit(main())
