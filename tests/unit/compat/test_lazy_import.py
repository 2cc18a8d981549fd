"""compat/lazy_import.py: funasr imported without its __init__'s zoo registers, for every recipe config, the
very classes the full import registers; the stage programs import no funasr before they install it, and
decode the same texts with it; the programs of the small steps import no torch.

This session has imported funasr whole (tests/conftest.py), so every lazy case runs in a child process.

  .venv/bin/python -m pytest tests/unit/compat/test_lazy_import.py -q
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import funasr_recipe.model.conformer_ctc  # noqa: F401  (registers ConformerCTC here too)
import funasr_recipe.model.sensevoice_tokenizer  # noqa: F401  (registers SenseVoiceTagTokenizer here too)
from funasr_recipe.compat import lazy_import
from tests.helpers.make_bad_kaldi_dir import DEFAULT_WAV_DIR

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = sorted((ROOT / "conf").glob("*.yaml"))
HEAVY = ("sklearn", "transformers", "triton", "scipy.stats")  # what funasr's __init__ drags in


def child(code: str, *args: str) -> dict:
    """Run ``code`` (HEAVY defined) in a fresh interpreter at the repository root; its last stdout line,
    as JSON."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = f"HEAVY = {HEAVY!r}\n{textwrap.dedent(code)}"
    res = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def qualnames(classes: dict[str, type | None]) -> dict[str, str | None]:
    return {k: f"{c.__module__}.{c.__qualname__}" if c else None for k, c in classes.items()}


LAZY_CLASSES = """
import json, sys
from omegaconf import OmegaConf
from funasr_recipe.compat import lazy_import
assert lazy_import.install() and lazy_import.is_lazy()
import funasr_recipe.model.conformer_ctc, funasr_recipe.model.sensevoice_tokenizer
cfg = OmegaConf.to_container(OmegaConf.load(sys.argv[1]))
modules = lazy_import.register_config(cfg)
classes = {k: f"{c.__module__}.{c.__qualname__}" if c else None
           for k, c in lazy_import.named_classes(cfg).items()}
print(json.dumps({"classes": classes, "lazy": lazy_import.is_lazy(), "modules": modules,
                  "heavy": [m for m in HEAVY if m in sys.modules]}))
"""


@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_every_config_gets_the_classes_of_the_full_import(config: Path) -> None:
    cfg = OmegaConf.to_container(OmegaConf.load(config))
    full = qualnames(lazy_import.named_classes(cfg))  # this session: funasr's own __init__ ran
    assert full and all(full.values()), full
    lazy = child(LAZY_CLASSES, str(config))
    assert lazy["classes"] == full
    twice = [name for name in lazy_import.config_strings(cfg)
             if any(len(m) > 1 for m in lazy_import.registry_index().get(name, {}).values())]
    if twice:  # Paraformer's decoder: two modules register it, the full import's order decides
        assert not lazy["lazy"], twice
    else:
        assert lazy["lazy"] and lazy["heavy"] == [] and lazy["modules"], lazy


def test_a_name_two_modules_register_is_found_and_resolved_as_the_full_import_does() -> None:
    from funasr.register import tables

    index = lazy_import.registry_index()
    modules = index["ParaformerSANMDecoder"]["decoder_classes"]
    assert sorted(modules) == ["funasr.models.e_paraformer.decoder", "funasr.models.paraformer.decoder"]
    # Not the last in walking order: a module imported early imports e_paraformer's after paraformer's.
    assert tables.decoder_classes["ParaformerSANMDecoder"].__module__ == "funasr.models.e_paraformer.decoder"
    assert index["SenseVoiceSmall"] == {"model_classes": ["funasr.models.sense_voice.model"]}


def registry() -> dict[str, dict[str, str]]:
    """Every table of this process's registry: name -> module.qualname, funasr's own classes only."""
    from funasr.register import tables

    return {t: {n: f"{c.__module__}.{c.__qualname__}" for n, c in getattr(tables, t).items()
                if c.__module__.startswith("funasr.")}
            for t in dir(tables) if t.endswith("_classes")}


@pytest.mark.slow  # a subprocess importing the whole of funasr
def test_complete_gives_the_whole_registry_and_binds_back_the_diarization_backend() -> None:
    got = child("""
        import json, sys
        from funasr_recipe.compat import lazy_import
        lazy_import.install()
        from funasr import AutoModel
        import funasr.auto.auto_model as am
        before = hasattr(am, "ClusterBackend")
        lazy_import.complete("test")
        import funasr
        from tests.unit.compat.test_lazy_import import registry
        print(json.dumps({"before": before, "after": hasattr(am, "ClusterBackend"),
                          "same": funasr.AutoModel is AutoModel, "lazy": lazy_import.is_lazy(),
                          "registry": registry(), "errors": callable(funasr.get_import_errors)}))
    """)
    assert got["before"] is False and got["after"] is True and got["same"] and got["errors"]
    assert not got["lazy"] and got["registry"] == registry()


def test_install_does_nothing_where_funasr_is_imported() -> None:
    import funasr

    assert not lazy_import.install() and not lazy_import.is_lazy()
    assert lazy_import.register(["SenseVoiceSmall"]) == [] and sys.modules["funasr"] is funasr


def test_the_programs_import_no_funasr_before_installing_it_and_the_small_steps_no_torch() -> None:
    got = child("""
        import json, sys
        import local.decode, local.export, local.bench_runtime, local.compute_fbank
        funasr = "funasr" in sys.modules
        print(json.dumps({"funasr": funasr}))
    """)
    assert got == {"funasr": False}
    # Stage 3's merge, scoring and summary, and the model lookup of stages 1-3, start in tenths of seconds.
    got = child("""
        import json, sys
        import local.decode, local.resolve_model, local.results_md, local.score, local.marker
        print(json.dumps({"torch": "torch" in sys.modules}))
    """)
    assert got == {"torch": False}


RUN_DECODE = """
import atexit, json, runpy, sys
from funasr_recipe.compat import lazy_import
atexit.register(lambda: print(json.dumps({"lazy": lazy_import.is_lazy(),
                                          "heavy": [m for m in HEAVY if m in sys.modules]})))
sys.argv = ["local.decode", *sys.argv[1:]]
runpy.run_module("local.decode", run_name="__main__")
"""


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data.jsonl of 12 real digit clips (every speaker)."""
    wavs = sorted(DEFAULT_WAV_DIR.glob("*.wav"))[::200][:12]
    if len(wavs) < 12:
        pytest.skip(f"{DEFAULT_WAV_DIR}: the bundled corpus is missing")
    words = "ZERO ONE TWO THREE FOUR FIVE SIX SEVEN EIGHT NINE".split()
    path = tmp_path_factory.mktemp("digits") / "data.jsonl"
    lines = [{"key": w.stem, "source": str(w), "source_len": 100, "target": words[int(w.stem.split("_")[0])],
              "text_language": "<|en|>"} for w in wavs]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.mark.slow  # stage 3's decoding in two subprocesses per family
@pytest.mark.parametrize("family", ["SenseVoiceSmall", "Paraformer", "ConformerCTC"])
def test_stage3_decodes_the_same_texts_with_the_lazy_import(family: str, digits: Path,
                                                            tmp_path: Path) -> None:
    from local.decode import main
    from tests.helpers.model_dirs import build_model_dir  # a random-init model dir of the family

    model_dir = build_model_dir(tmp_path, family, digits)
    opts = ["--model-dir", str(model_dir), "--data-jsonl", str(digits), "--rank", "0", "--world-size", "1",
            "--batch-size", "4"]
    assert main(["work", *opts, "--out", str(tmp_path / "full")]) == 0  # this session's full import
    got = child(RUN_DECODE, "work", *opts, "--out", str(tmp_path / "lazy"))
    # Paraformer's decoder is registered twice (test above): the child imports all of funasr.
    assert (got["lazy"], got["heavy"] == []) == ((True, True) if family != "Paraformer" else (False, False))
    full, lazy = ((tmp_path / d / "shards" / "0.jsonl").read_text().splitlines() for d in ("full", "lazy"))
    assert len(full) == 12 and sorted(lazy) == sorted(full)
