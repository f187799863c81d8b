"""``--schema``: the output type a chat answers with, and the validated JSON it prints.

The flag names a JSON schema file (``order.schema.json``) or a Python type as
``module:Name`` (``shop.models:Order``, imported from the current folder or the
installed packages). Either way the answer is constrained and validated as
``output_type`` (see docs/structured-output.md), and what is printed is the
validated value as JSON, not the model's raw text.
"""

from __future__ import annotations

import importlib
import json
import re
import sys
from pathlib import Path
from typing import Any

from threadline._errors import InvalidRequestError
from threadline.cli._errors import CliError
from threadline.tools._output import SchemaOutput, output_spec
from threadline.tools._signature import argument_converter

__all__ = ["output_type_of", "validated_json"]

_TYPE_PATH = re.compile(r"^(?P<module>[A-Za-z_][\w.]*):(?P<name>[A-Za-z_][\w.]*)$")


def output_type_of(spec: str) -> Any:
    """The output type ``--schema spec`` names, checked to have a JSON schema.

    Raises:
        CliError: no such file, module or name, a file that is not a JSON object,
            or a type threadline cannot describe.
    """
    found = _TYPE_PATH.match(spec)
    output_type = _python_type(found["module"], found["name"]) if found else _schema_file(spec)
    try:
        output_spec(output_type)
    except InvalidRequestError as exc:
        raise CliError(f"--schema {spec}: {exc}") from None
    return output_type


def _schema_file(spec: str) -> SchemaOutput:
    path = Path(spec)
    if not path.is_file():
        raise CliError(
            f"--schema {spec}: no such file (give a JSON schema file or a type as module:Name)"
        )
    try:
        text = path.read_text(encoding="utf-8")
        json.loads(text)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CliError(f"--schema {spec}: not a readable JSON file ({exc})") from None
    name = path.name.split(".")[0] or "answer"
    return SchemaOutput(name=name, text=text)


def _python_type(module_name: str, name: str) -> Any:
    # Like `python -m`, a module in the current folder is found first.
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        found: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise CliError(
            f"--schema {module_name}:{name}: cannot import {module_name} ({exc})"
        ) from None
    for part in name.split("."):
        if part not in vars(found):
            raise CliError(f"--schema {module_name}:{name}: {module_name} has no {name}")
        found = vars(found)[part]
    return found


def validated_json(value: Any) -> str:
    """The validated answer as indented JSON: classes as objects of their fields."""
    return json.dumps(argument_converter().unstructure(value), indent=2, ensure_ascii=False)
