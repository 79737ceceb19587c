"""Notebooks as jobs: checks before submitting, the cell magic's notebook, errors after.

Notebooks run with papermill on the system (``papermill_runner``, stdlib and papermill
code the job's interpreter runs with ``-c``), so only papermill and a kernel must exist in
the job's environment — not jupyter_cloudtik.  What went wrong
is read back from the executed notebook: papermill stores the exception in the failing
cell's outputs, and the first cell with an error output is the one to show people.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

from ..core.errors import ConfigError, NotFoundError

log = logging.getLogger(__name__)
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
PAPERMILL_ERROR_TAG = "papermill-error-cell-tag"


def check_notebook(path: str | Path, field: str = "notebook") -> dict[str, Any]:
    """Read and check a notebook before anything is submitted."""
    p = Path(path).expanduser()
    if not p.exists():
        raise NotFoundError(f"{field}: {str(path)!r} does not exist", field=field)
    if p.is_dir():
        raise ConfigError(f"{field}: {str(path)!r} is a folder, not a notebook", field=field)
    try:
        nb = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{field}: {str(path)!r} is not a notebook (not JSON: {e})",
                          field=field) from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list) \
            or nb.get("nbformat", 0) < 4:
        raise ConfigError(
            f"{field}: {str(path)!r} is not a version-4 notebook (no 'cells' list)",
            field=field)
    return nb


class ParametersNotInspectable(LookupError):
    """papermill has no inspection of parameters for the notebook's language (only Python
    has one): the names cannot be known here, and that is no fault of the notebook."""

    def __init__(self, language: str) -> None:
        super().__init__(f"papermill cannot inspect {language} code; it inspects Python")
        self.language = language


class ParameterCheckFailed(Exception):
    """The parameter names could not be read for another reason (no translator for the
    kernel, a notebook papermill cannot read, an error in the inspection): not a reason
    to skip the check, so the submission is refused unless the caller opts out."""


def check_parameters(nb: dict[str, Any], parameters: dict[str, Any], *, notebook: str,
                     kernel: str | None = None, allow_unknown: bool = False,
                     option: str = "--allow-unknown-parameters (allow_unknown_parameters: true)",
                     ) -> list[str]:
    """Refuse parameters the notebook cannot receive; with ``allow_unknown``, warnings.

    papermill does not refuse them itself: a parameter the parameters cell does not
    assign is injected anyway (and, without a cell tagged ``parameters``, injected at the
    top, where the notebook's own assignments overwrite it), so the job succeeds with the
    notebook's defaults — a silent wrong result.  The names are the ones papermill's own
    inspection (``papermill --help-notebook``) reads from the parameters cell.  Returns
    the warnings to show (empty when every parameter has a place).

    The check never passes by failing: a notebook in a language papermill cannot inspect
    (R, Julia, ...) is submitted with a warning that its names were not checked; any
    other reason the names cannot be read refuses the submission (``ConfigError`` naming
    ``parameters.<first>`` and the cause), or, with ``allow_unknown``, warns.
    """
    if not parameters:
        return []
    given = list(parameters)
    first = given[0]
    try:
        names = notebook_parameters(nb, kernel)
    except ParametersNotInspectable as e:  # it has the cell, papermill fills it
        log.info("%s: parameter names not checked (%s)", notebook, e)
        one = len(given) == 1
        return [f"parameters: the parameter names of {_a(e.language)} notebook are not "
                f"checked ({e}): {', '.join(given)} {'is' if one else 'are'} injected into "
                f"{notebook!r} after its cell tagged `parameters`, whether that cell "
                f"assigns {'it' if one else 'them'} or not"]
    except ParameterCheckFailed as e:
        cause = _one_line(str(e))
        if not allow_unknown:
            raise ConfigError(
                f"parameters.{first}: the parameters of {notebook!r} could not be checked: "
                f"{cause}; pass {option} to submit them unchecked",
                field=f"parameters.{first}") from None
        return [f"parameters: the parameters of {notebook!r} could not be checked ({cause}); "
                "submitted unchecked (allow_unknown_parameters)"]
    if names is None:
        problem = (f"{notebook!r} has no cell tagged 'parameters', so papermill would "
                   f"inject {', '.join(given)} in a cell at the top, where any assignment "
                   "in the notebook overrides it")
        if not allow_unknown:
            raise ConfigError(
                f"parameters.{first}: {parameters[first]!r} cannot reach the notebook: "
                f"{problem}; tag the cell that assigns them `parameters` (in JupyterLab: "
                f"the property inspector's cell tags), or pass {option} to run anyway",
                field=f"parameters.{first}")
        return [f"parameters: {problem}; submitted anyway (allow_unknown_parameters)"]
    unknown = [k for k in given if k not in names]
    if not unknown:
        return []
    allowed = ", ".join(names) if names else "none (its parameters cell assigns no names)"
    bad = ", ".join(f"{k}={parameters[k]!r}" for k in unknown)
    bad += " is not a parameter" if len(unknown) == 1 else " are not parameters"
    if not allow_unknown:
        first = unknown[0]
        raise ConfigError(
            f"parameters.{first}: {bad} of {notebook!r}; its cell "
            f"tagged `parameters` assigns: {allowed} (or pass {option} to inject it "
            "anyway)",
            field=f"parameters.{first}")
    return [f"parameters: {bad} of {notebook!r} (its cell tagged "
            f"`parameters` assigns: {allowed}); papermill injects it after that cell anyway"]


def parameters_cell(nb: dict[str, Any]) -> dict[str, Any] | None:
    """The cell papermill injects after: the first whose ``metadata.tags`` holds
    ``parameters``; None without one.

    Read from the notebook as saved, whatever wrote it: JupyterLab, VS Code and nbformat
    write ``"metadata": {}`` on untagged cells (papermill's own helper,
    ``find_first_tagged_cell_index``, only works on notebooks papermill loaded itself,
    which gives every cell a ``tags`` list), and a cell may have no metadata at all.
    """
    for cell in nb.get("cells") or []:
        if not isinstance(cell, dict):
            continue
        metadata = cell.get("metadata")
        tags = metadata.get("tags") if isinstance(metadata, dict) else None
        if isinstance(tags, (list, tuple)) and "parameters" in tags:
            return cell
    return None


def parameters_view(nb: dict[str, Any]) -> dict[str, Any]:
    """As much of ``nb`` as the parameter checks read (``check_parameters``): its format,
    its metadata (kernel, language) and its cell tagged ``parameters``, if any.  What a
    reader process hands back for a large notebook (``notebook_reader``)."""
    cell = parameters_cell(nb)
    return {"nbformat": nb.get("nbformat"), "nbformat_minor": nb.get("nbformat_minor"),
            "metadata": nb.get("metadata"), "cells": [cell] if cell is not None else []}


def notebook_parameters(nb: dict[str, Any], kernel: str | None = None) -> list[str] | None:
    """The names the cell tagged ``parameters`` assigns; None without such a cell.

    Read with papermill's own inspection (the translator papermill would inject with, for
    the job's kernel and the notebook's language, as ``papermill --help-notebook`` does;
    ``papermill.inspection.inspect_notebook`` only takes a path, and a notebook sent as
    content has none).  Raises ``ParametersNotInspectable`` when papermill has no
    inspection for the language (only Python has one), ``ParameterCheckFailed`` when the
    names cannot be read for any other reason (papermill could not inject either, or the
    inspection itself failed): never an empty answer for an error.
    """
    cell = parameters_cell(nb)
    if cell is None:
        return None
    from papermill.exceptions import PapermillException
    from papermill.translators import papermill_translators

    metadata = nb.get("metadata") if isinstance(nb.get("metadata"), dict) else {}
    kernelspec = metadata.get("kernelspec") if isinstance(metadata.get("kernelspec"),
                                                          dict) else {}
    language_info = metadata.get("language_info") if isinstance(
        metadata.get("language_info"), dict) else {}
    name = kernel or kernelspec.get("name") or ""
    # papermill's nb_language: language_info.name, else the kernelspec's language
    language = language_info.get("name") or kernelspec.get("language") or ""
    if not language and str(name).startswith("python"):
        language = "python"  # no language in the metadata: the kernel's, as it says
    if not name and not language:
        raise ParameterCheckFailed("the notebook names no kernel and no language (no "
                                   "metadata.kernelspec or metadata.language_info)")
    try:
        translator = papermill_translators.find_translator(name, language)
    except PapermillException as e:
        raise ParameterCheckFailed(f"papermill cannot inject parameters into it ({e})") \
            from None
    source = cell.get("source")
    if isinstance(source, list):  # as saved on disk: one string per line
        source = "".join(str(s) for s in source)
    if not isinstance(source, str):
        raise ParameterCheckFailed(f"its cell tagged `parameters` has no source text "
                                   f"({type(source).__name__})")
    import nbformat

    try:
        params = translator.inspect(nbformat.from_dict({**cell, "source": source}))
    except NotImplementedError:
        raise ParametersNotInspectable(language or name) from None
    except Exception as e:  # the inspection itself broke: say so, never "no names"
        raise ParameterCheckFailed(
            f"papermill's inspection of its cell tagged `parameters` failed "
            f"({type(e).__name__}: {e})") from None
    return [p.name for p in params]


def _a(word: str) -> str:
    """``an R``, ``a Julia``, ``an OCaml``: the article as the word is said."""
    vowel = word[:1].upper() in ("AEFHILMNORSX" if len(word) == 1 else "AEIOU")
    return f"{'an' if vowel else 'a'} {word}"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def notebook_from_cell(source: str, parameters: dict[str, Any] | None = None,
                       kernel: str = "python3") -> dict[str, Any]:
    """A notebook holding one cell (the ``%%hpc`` cell magic's job)."""
    params = parameters or {}
    params_src = "\n".join(f"{k} = {v!r}" for k, v in params.items()) or "# parameters"
    return {
        "nbformat": 4,
        "nbformat_minor": 5,
        "metadata": {
            "kernelspec": {"name": kernel, "display_name": "Python 3", "language": "python"},
            "language_info": {"name": "python"},
        },
        "cells": [
            {"cell_type": "code", "id": "parameters", "metadata": {"tags": ["parameters"]},
             "execution_count": None, "outputs": [], "source": params_src},
            {"cell_type": "code", "id": "cell", "metadata": {}, "execution_count": None,
             "outputs": [], "source": source},
        ],
    }


def find_error(nb: dict[str, Any] | bytes | str) -> dict[str, Any] | None:
    """The first cell that raised, as a small dict for the job's status; None if none did."""
    if isinstance(nb, (bytes, str)):
        try:
            nb = json.loads(nb)
        except json.JSONDecodeError:
            return None
    index = 0  # count code cells the way people see them (papermill's own cell skipped)
    for cell in nb.get("cells", []):
        tags = (cell.get("metadata") or {}).get("tags") or []
        if PAPERMILL_ERROR_TAG in tags:
            continue
        if cell.get("cell_type") != "code":
            index += 1
            continue
        for out in cell.get("outputs") or []:
            if out.get("output_type") == "error":
                tb = [_ANSI.sub("", line) for line in out.get("traceback") or []]
                return {
                    "cell": index,
                    "execution_count": cell.get("execution_count"),
                    "ename": out.get("ename"),
                    "evalue": out.get("evalue"),
                    "source": _source(cell)[:2000],
                    "traceback": "\n".join(tb)[-4000:],
                }
        index += 1
    return None


def describe_error(err: dict[str, Any] | None) -> str | None:
    if not err:
        return None
    where = f"cell {err['cell']}"
    if err.get("execution_count"):
        where += f" [{err['execution_count']}]"
    return f"{where} raised {err.get('ename')}: {err.get('evalue')}"


def cell_outputs_text(nb: dict[str, Any] | bytes | str, cell_id: str = "cell") -> str:
    """The text the given cell printed (for showing a ``%%hpc`` job's result)."""
    if isinstance(nb, (bytes, str)):
        nb = json.loads(nb)
    parts = []
    for cell in nb.get("cells", []):
        if cell.get("id") != cell_id:
            continue
        for out in cell.get("outputs") or []:
            kind = out.get("output_type")
            if kind == "stream":
                parts.append(_text(out.get("text")))
            elif kind in ("execute_result", "display_data"):
                parts.append(_text((out.get("data") or {}).get("text/plain")) + "\n")
            elif kind == "error":
                parts.append(f"{out.get('ename')}: {out.get('evalue')}\n")
    return "".join(parts)


def _source(cell: dict[str, Any]) -> str:
    return _text(cell.get("source"))


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list):
        return "".join(value)
    return str(value)
