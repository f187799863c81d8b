"""``threadline chat --schema``: a JSON schema file or a Python type, and the validated JSON."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from test_cli import errors, invoke
from threadline.testing import ScriptedDriver

MODELS = '''
import attrs

@attrs.frozen
class Order:
    """An order.

    Attributes:
        customer: Who ordered.
    """

    customer: str
    items: list[str]
    rush: bool = False
'''


@pytest.fixture
def shop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    package = tmp_path / "shop_models_for_cli.py"
    package.write_text(MODELS, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield package
    sys.modules.pop("shop_models_for_cli", None)


def test_a_python_type_gives_the_validated_json_not_the_raw_text(db: Path, shop: Path) -> None:
    driver = ScriptedDriver(['{"customer": "Ada", "items": ["tea"], "rush": null}'])
    run = invoke(
        "chat",
        "--db",
        str(db),
        "--schema",
        "shop_models_for_cli:Order",
        "--once",
        "order?",
        driver=driver,
    )
    assert run.code == 0, run.err
    assert json.loads(run.out) == {"customer": "Ada", "items": ["tea"], "rush": False}
    assert run.out.startswith('{\n  "customer": "Ada"')
    schema = driver.calls[0].output
    assert schema is not None
    assert schema.schema["properties"]["customer"]["description"] == "Who ordered."


def test_a_json_schema_file_gives_the_validated_json(db: Path, tmp_path: Path) -> None:
    path = tmp_path / "colours.schema.json"
    path.write_text(json.dumps({"type": "array", "items": {"type": "string"}}), encoding="utf-8")
    driver = ScriptedDriver(['{"value": ["red", "green"]}'])
    run = invoke("chat", "--db", str(db), "--schema", str(path), "--once", "two?", driver=driver)
    assert run.code == 0, run.err
    assert json.loads(run.out) == ["red", "green"]
    schema = driver.calls[0].output
    assert schema is not None
    assert schema.name == "colours"
    assert schema.schema["properties"]["value"] == {"type": "array", "items": {"type": "string"}}


def test_an_answer_that_fails_twice_is_one_error_line_and_nothing_saved(
    db: Path, tmp_path: Path
) -> None:
    path = tmp_path / "n.json"
    path.write_text('{"type": "integer"}', encoding="utf-8")
    driver = ScriptedDriver(["seven", "still seven"])
    run = invoke(
        "chat",
        "--db",
        str(db),
        "--conversation",
        "c1",
        "--schema",
        str(path),
        "--once",
        "n?",
        driver=driver,
    )
    assert run.code != 0
    assert "not a valid value of the output type after 2 attempt(s)" in run.err
    shown = invoke("conversations", "show", "c1", "--db", str(db))
    assert "seven" not in shown.out


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("missing.schema.json", "no such file"),
        ("no_such_module_xyz:Order", "cannot import no_such_module_xyz"),
        ("shop_models_for_cli:Nothing", "has no Nothing"),
        ("builtins:complex", "cannot describe"),
    ],
)
def test_a_schema_that_cannot_be_used_is_named(db: Path, shop: Path, spec: str, says: str) -> None:
    run = invoke(
        "chat", "--db", str(db), "--schema", spec, "--once", "x", driver=ScriptedDriver([])
    )
    assert run.code != 0
    assert says in run.err
    assert not errors(run) or spec in run.err


def test_a_file_that_is_not_json_is_named(db: Path, tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text("{nope", encoding="utf-8")
    run = invoke(
        "chat", "--db", str(db), "--schema", str(path), "--once", "x", driver=ScriptedDriver([])
    )
    assert run.code != 0
    assert "not a readable JSON file" in run.err
