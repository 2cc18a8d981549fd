"""What a model dir is, in words that name what was used: the model it started from (a hub id, or the
config a run of this recipe trained from scratch with), the config and pretrained dir of the run that made
it, and the checkpoint. Results (RESULTS.md rows), logs ("fine-tuning ...") and the model card name models
through here, never by the config file's name alone: a tiny model fine-tuned with conf/sensevoice_small.yaml
is no "sensevoice_small".

Reads  <model-dir>/configuration.json: ModelScope's ``model_name_in_hub`` for a hub model's local copy,
       this recipe's ``recipe`` record for one of ours (model/model_dir.py writes it: checkpoint,
       exp_dir, and since this module the run's config, pretrained dir and ``model``);
       <exp-dir>/train_identity.json, stage 2's record of its options (train/resume_guard.py);
writes nothing.

  model_label(Path("exp/x/final"))  # tiny_sensevoice.yaml fine-tuned from /m/base, average of 3 checkpoints
  describe_model_dir(Path("/m/SenseVoiceSmall"))  # /m/SenseVoiceSmall (a local copy of iic/SenseVoiceSmall)
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from funasr_recipe.core.rejections import BadInputError

# Stage 2's record of what a run trained with (train/resume_guard.py writes it): each option JSON-encoded.
TRAIN_IDENTITY = "train_identity.json"
CONFIGURATION = "configuration.json"


def run_options(exp_dir: Path) -> dict[str, str]:
    """Stage 2's options of the run in ``exp_dir`` as given (``config``, ``pretrained-dir``, ``exp-dir``,
    ``train-set``, ...), from its train_identity.json (``option.*``, and ``given.*``: the paths whose
    content the identity compares); {} for a run from before that record."""
    try:
        identity = json.loads((exp_dir / TRAIN_IDENTITY).read_text(encoding="utf-8"))
        return {key.split(".", 1)[1]: str(json.loads(value)) for key, value in identity.items()
                if key.startswith(("option.", "given."))}
    except (OSError, ValueError, AttributeError):
        return {}


def configuration(model_dir: Path) -> dict:
    """A model dir's configuration.json ({} where there is none); bad JSON is bad input, named."""
    path = model_dir / CONFIGURATION
    if not path.is_file():
        return {}
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise BadInputError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
    return found if isinstance(found, dict) else {}


def hub_name(model_dir: Path) -> str | None:
    """The hub id a model dir is a local copy of (ModelScope's, else Hugging Face's), None for others."""
    names = configuration(model_dir).get("model_name_in_hub")
    if not isinstance(names, dict):
        return None
    return names.get("ms") or names.get("hf") or None


def recipe_record(model_dir: Path) -> dict | None:
    """This recipe's record of how it made the model dir, None for a model dir that is not ours."""
    record = configuration(model_dir).get("recipe")
    return record if isinstance(record, dict) else None


def base_model(model_dir: Path) -> str:
    """The model a model dir is at its root: the hub id it copies, or what our record says (the config a
    from-scratch run used, or the base of the model a fine-tune started from), else the dir's name."""
    record = recipe_record(model_dir)
    if record and record.get("model"):
        return str(record["model"])
    return hub_name(model_dir) or Path(model_dir).resolve().name


def provenance(exp_dir: Path) -> dict[str, str]:
    """What make_model_dir records of the run in ``exp_dir`` beside the checkpoint: its config, the
    pretrained dir it fine-tuned (if any) and ``model``, the base model; {} where the run is unrecorded."""
    options = run_options(exp_dir)
    if "config" not in options:
        return {}
    pretrained = options.get("pretrained-dir")
    model = base_model(Path(pretrained)) if pretrained else Path(options["config"]).name
    return {"config": options["config"], **({"pretrained": pretrained} if pretrained else {}), "model": model}


def checkpoint_words(checkpoint: str) -> str:
    """A checkpoint's name in words: model.pt.avg3 -> "average of 3 checkpoints", model.pt.ep12 ->
    "epoch 12 checkpoint", model.pt.ep0.2000 -> "epoch 0 step 2000 checkpoint"."""
    name = str(checkpoint).removeprefix("model.pt.")
    if m := re.fullmatch(r"avg(\d+)", name):
        return f"average of {m[1]} checkpoint{'s' * (m[1] != '1')}"
    if m := re.fullmatch(r"ep(\d+)(?:\.(\d+))?", name):
        return f"epoch {m[1]}{f' step {m[2]}' if m[2] else ''} checkpoint"
    return {"best": "best checkpoint", "model.pt": "last checkpoint"}.get(name, f"checkpoint {name}")


def model_label(model_dir: Path, tag: str | None = None, pretrained: bool = False) -> str:
    """How results name a model. The one a run fine-tuned from: ``pretrained <base> (<dir>)``. One of this
    recipe's: ``<base> fine-tuned from <pretrained dir>, <checkpoint>`` or ``<config> from scratch,
    <checkpoint>``; a model dir made before the record named its run: ``<tag> <checkpoint>`` as it used to.
    Anything else: BadInputError (stage 3's model dirs are this recipe's)."""
    if pretrained:
        base = base_model(model_dir)
        return f"pretrained {model_dir}" if base == Path(model_dir).resolve().name else \
            f"pretrained {base} ({model_dir})"
    record = recipe_record(model_dir)
    if not record or "checkpoint" not in record:
        raise BadInputError(f"{model_dir / CONFIGURATION}: no recipe checkpoint; is {model_dir} a model dir "
                            "of this recipe's stage 3?")
    checkpoint = str(record["checkpoint"])
    if "model" not in record:
        return f"{tag or Path(model_dir).resolve().name} {checkpoint.removeprefix('model.pt.')}"
    how = f"fine-tuned from {record['pretrained']}" if record.get("pretrained") else "from scratch"
    return f"{record['model']} {how}, {checkpoint_words(checkpoint)}"


def describe_model_dir(model_dir: Path) -> str:
    """A model dir for a log line: the dir, and what it is where that is known (a hub id's local copy, or
    this recipe's model and how it was made)."""
    if hub := hub_name(model_dir):
        return f"{model_dir} (a local copy of {hub})"
    record = recipe_record(model_dir)
    if record and "model" in record and "checkpoint" in record:
        return f"{model_dir} ({model_label(model_dir)})"
    if record and "checkpoint" in record:  # made before the record named its run
        return f"{model_dir} (a model dir of this recipe, {checkpoint_words(record['checkpoint'])})"
    return str(model_dir)
