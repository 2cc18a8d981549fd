"""Whether this Python can run the GPU check: the stage programs and funasr's classes they need import,
and from where (the installed wheel set, or the machine's own packages).

Reads nothing but the imports; writes one line per package (version, origin) and, with CUDA, the GPU, to
stdout. Exit 1 naming what is missing: a module that does not import, or a funasr class that funasr's
tolerant ``import funasr`` left unregistered (with the error it recorded), which would otherwise surface
as "SenseVoiceSmall is not registered" deep inside training.

  PYTHONPATH=<site>:. python -m bench.gpu.imports --site <site>
"""

from __future__ import annotations

import importlib
import sys
import traceback
from pathlib import Path

from funasr_recipe.core.cli import program_parser
from funasr_recipe.families.registry import SENSEVOICE  # torch-free: safe before the checks

# What bench/gpu/check.sh runs: run.sh's stage 0-2 programs, stage 3's decoding, and the trainer they use.
PROGRAMS = ("recipes.fsdd.prepare", "local.prepare_data", "local.corpus_info", "local.marker",
            "local.compute_fbank", "local.train", "local.decode", "funasr_recipe.model.trainer",
            "funasr_recipe.model.inference", "funasr.bin.train_ds", "bench.gpu.random_model_dir",
            "bench.gpu.report")
# (funasr registry table, name, the funasr module that registers it)
CLASSES = (("model_classes", SENSEVOICE.name, "funasr.models.sense_voice.model"),
           ("encoder_classes", "SenseVoiceEncoderSmall", "funasr.models.sense_voice.model"),
           ("frontend_classes", "WavFrontend", "funasr.frontends.wav_frontend"),
           ("dataset_classes", "SenseVoiceCTCDataset", "funasr.datasets.sense_voice_datasets.datasets"),
           ("tokenizer_classes", "SenseVoiceTagTokenizer", "funasr_recipe.model.sensevoice_tokenizer"))
PACKAGES = ("torch", "torchaudio", "numpy", "funasr", "deepspeed", "hydra", "omegaconf", "kaldiio",
            "soundfile", "librosa", "sentencepiece", "onnxruntime")


def origin(module: object, site: Path | None) -> str:
    path = Path(getattr(module, "__file__", "") or "")
    return "wheel set" if site is not None and site.resolve() in path.resolve().parents else "this machine"


def check(site: Path | None) -> list[str]:
    """What is missing (empty: all there); prints the versions and origins on the way."""
    missing = []
    for name in PROGRAMS:
        try:
            importlib.import_module(name)
        except Exception as e:  # any import-time failure: name it, with where it came from
            missing.append(f"{name}: {type(e).__name__}: {e}\n{traceback.format_exc(limit=-3)}")
    import funasr
    from funasr.register import tables

    from funasr_recipe.model.trainer import register_recipe_classes

    register_recipe_classes()
    errors = funasr.get_import_errors()
    from funasr_recipe.data.feats_dataset import FBANK_DATASETS

    # Stage 2 trains on stage-1 features through the recipe's variant of the config's dataset.
    fbank = ("dataset_classes", FBANK_DATASETS["SenseVoiceCTCDataset"], "funasr_recipe.data.feats_dataset")
    for table, name, module in (*CLASSES, fbank):
        if getattr(tables, table).get(name) is None:
            missing.append(f"funasr {table} has no {name}: {module}: {errors.get(module, 'not imported')}")
    for name in PACKAGES:
        try:
            mod = importlib.import_module(name)
            print(f"{name:<14} {getattr(mod, '__version__', '?'):<22} {origin(mod, site)}")
        except Exception as e:
            missing.append(f"{name}: {type(e).__name__}: {e}")
    import torch

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        print(f"GPU: {torch.cuda.device_count()} x {props.name}, {props.total_memory / 2**30:.0f} GiB, "
              f"compute capability {props.major}.{props.minor}, CUDA {torch.version.cuda}, "
              f"bf16 {torch.cuda.is_bf16_supported()}")
    else:
        print("GPU: none (torch.cuda.is_available() is False)")
    return missing


def main(argv: list[str] | None = None) -> int:
    parser = program_parser(__doc__)
    parser.add_argument("--site", type=Path, help="the --target dir the wheels were installed into")
    args = parser.parse_args(argv)
    missing = check(args.site)
    for line in missing:
        print(f"MISSING {line}", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
