"""How stages report bad input: one ``Rejection`` per entry, in ``rejected.tsv`` or as a fatal error.

Every stage that drops an utterance says where it came from (file, line, key) and why, so that
entries in = accepted + rejected at every stage, and ``--strict true`` turns the first one fatal.
"""

from __future__ import annotations

from dataclasses import dataclass

REJECTED_HEADER = "file\tline\tkey\treason\tdetail\n"


class BadInputError(ValueError):
    """The user's input is wrong: a file, a line of it, an option, a config, a model dir the stage does not
    support. The one class raised where input is validated (and the base of the package's own validation
    errors: data/kaldi_table.TableError, features/audio.AudioError, scoring/score.ScoreInputError,
    model/checkpoint.py's); core/cli.run_main reports it as exit 2, one line. A ValueError of any other
    kind (numpy's, torch's) is a bug and keeps its traceback. A ValueError for ``pytest.raises``.

    In strict mode, the first bad entry: ``<file>:<line>: <key>: <reason>: <detail>``."""


@dataclass
class Rejection:
    file: str
    line: int | None
    key: str
    reason: str
    detail: str

    def tsv(self) -> str:
        """One line of rejected.tsv (tabs and newlines inside the detail become spaces)."""
        detail = self.detail.replace("\t", " ").replace("\n", " ")
        return f"{self.file}\t{'' if self.line is None else self.line}\t{self.key}\t{self.reason}\t{detail}\n"

    def message(self) -> str:
        """``file:line: key: reason: detail``, as an error message names it."""
        line = "" if self.line is None else self.line
        return f"{self.file}:{line}: {self.key}: {self.reason}: {self.detail}"

    def fatal(self) -> BadInputError:
        """The strict-mode error of this rejection."""
        return BadInputError(f"strict mode: {self.message()}")
