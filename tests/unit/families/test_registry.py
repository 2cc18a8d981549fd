"""The family registry against funasr's own tables, and its use: no family chosen by its name elsewhere."""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path

import pytest

from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.families.registry import (
    FAMILIES,
    FUNASR_ONNX,
    SENSEVOICE,
    SHERPA_ONNX,
    decoding_spec,
    family_spec,
    supporting,
)
from funasr_recipe.model.released import CONFIG_DIR

ROOT = Path(__file__).resolve().parents[3]
SCANNED = ("funasr_recipe", "local", "bench", "recipes")  # the code; tests name families freely


def _init_literals(cls: type, names: tuple[str, ...]) -> dict[str, object]:
    """The literal values ``cls.__init__`` assigns to ``self.<name>`` (building the model would cost its
    weights)."""
    found: dict[str, object] = {}
    for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(cls.__init__)))):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Attribute) and target.attr in names:
                found[target.attr] = ast.literal_eval(node.value)
    return found


def test_sensevoice_prompt_ids_are_funasrs() -> None:
    from funasr.models.sense_voice.model import SenseVoiceSmall

    found = _init_literals(SenseVoiceSmall,
                           ("lid_dict", "lid_int_dict", "textnorm_dict", "textnorm_int_dict"))
    assert found == {"lid_dict": dict(SENSEVOICE.language_ids),
                     "lid_int_dict": dict(SENSEVOICE.language_token_ids),
                     "textnorm_dict": dict(SENSEVOICE.textnorm_ids),
                     "textnorm_int_dict": dict(SENSEVOICE.textnorm_token_ids)}


def test_onnx_names_are_the_export_codes() -> None:
    from funasr.models.paraformer import export_meta as paraformer_meta
    from funasr.models.sense_voice import export_meta as sensevoice_meta

    from funasr_recipe.model.conformer_ctc import ConformerCTCExport

    exporters = {"SenseVoiceSmall": sensevoice_meta, "Paraformer": paraformer_meta,
                 "ConformerCTC": ConformerCTCExport}
    assert set(exporters) == set(FAMILIES)
    for name, code in exporters.items():
        spec = FAMILIES[name]
        assert (tuple(code.export_input_names(None)), tuple(code.export_output_names(None))) == \
            (spec.onnx_inputs, spec.onnx_outputs), name


def test_every_family_is_a_registered_model_class_and_its_runtimes_exist() -> None:
    import funasr_onnx
    from funasr.register import tables

    from funasr_recipe.model.trainer import register_recipe_classes

    register_recipe_classes()
    for name, spec in FAMILIES.items():
        assert tables.model_classes.get(name) is not None, name
        assert (FUNASR_ONNX in spec.runtimes) == hasattr(funasr_onnx, name), name
        if spec.released:
            assert (CONFIG_DIR / f"{spec.released}.yaml").is_file(), name
        assert spec.decoding_doc, name
    assert supporting(SHERPA_ONNX) == ("SenseVoiceSmall",)


def test_an_unknown_family_is_named_and_decodes_generically() -> None:
    with pytest.raises(BadInputError, match=r"exp/x: model 'BiCifParaformer': the recipe's families are "
                                         "SenseVoiceSmall, Paraformer, ConformerCTC"):
        family_spec("BiCifParaformer", "exp/x")
    generic = decoding_spec("BiCifParaformer")
    assert (generic.prompt_frames, generic.emits_tags, generic.runtimes) == (0, False, frozenset())
    with pytest.raises(BadInputError, match="languages"):
        SENSEVOICE.prompt("xx")
    assert SENSEVOICE.prompt("en", "withitn") == {"language": 4, "textnorm": 14}
    assert FAMILIES["Paraformer"].prompt("en") == {}


def family_literals(root: Path) -> list[str]:
    """Every string literal outside a docstring that is exactly a family name, in the code under
    ``root`` outside funasr_recipe/families/, as ``file:line: name``: a comparison, a dict key, a tuple
    member or an argument, which all choose a family by its name instead of by its spec."""
    found = []
    for folder in SCANNED:
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root)
            if rel.parts[:2] == ("funasr_recipe", "families"):
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                          if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                          and n.body and isinstance(n.body[0], ast.Expr)
                          and isinstance(n.body[0].value, ast.Constant)}
            found += [f"{rel}:{n.lineno}:{n.col_offset}: {n.value}" for n in ast.walk(tree)
                      if isinstance(n, ast.Constant) and n.value in FAMILIES and id(n) not in docstrings]
    return sorted(found)


def test_no_family_is_chosen_by_its_name_outside_the_registry() -> None:
    assert family_literals(ROOT) == []


def test_the_scan_finds_a_planted_comparison(tmp_path: Path) -> None:
    (tmp_path / "funasr_recipe" / "serving").mkdir(parents=True)
    (tmp_path / "funasr_recipe" / "families").mkdir()
    (tmp_path / "funasr_recipe" / "families" / "registry.py").write_text('NAME = "Paraformer"\n')
    (tmp_path / "funasr_recipe" / "serving" / "x.py").write_text(
        '"""Paraformer"""\n\ndef f(family):\n    """SenseVoiceSmall"""\n'
        '    return {"ConformerCTC": 1}.get(family) if family != "SenseVoiceSmall" else 0\n')
    assert family_literals(tmp_path) == ["funasr_recipe/serving/x.py:5:12: ConformerCTC",
                                         "funasr_recipe/serving/x.py:5:56: SenseVoiceSmall"]
