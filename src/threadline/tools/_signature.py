"""From a typed function to its arguments' schema, and from checked arguments back to a call.

:func:`signature_parameters` reads a function's signature, type hints and
docstring into the object schema of its arguments, and gives the
:class:`Binder` that turns arguments which passed that schema into the
function's positional and keyword arguments. The values are built by the
argument converter (cattrs, ``threadline.serialization._hooks``): Enum
members, attrs instances, tuples where the hints ask for them.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import attrs
from cattrs import Converter

from threadline._errors import InvalidRequestError
from threadline.serialization._hooks import make_argument_converter
from threadline.tools._check import check
from threadline.tools._docstrings import parse_docstring
from threadline.tools._schema import object_schema, schema_for, type_hints, with_default

__all__ = ["Binder", "argument_converter", "call_method", "docstring", "signature_parameters"]


def _fits_schema_of(hint: Any) -> Callable[[Any], bool]:
    schema = schema_for(hint, where="")
    return lambda value: not check(value, schema)


@functools.cache
def argument_converter() -> Converter:
    """The converter that builds a tool function's arguments, made on first use.

    A union's member is the first whose schema the value passes.
    """
    return make_argument_converter(fits=_fits_schema_of)


@attrs.frozen
class Binder:
    """How to call a function built into a tool from its checked arguments."""

    hints: Mapping[str, Any]
    positional_only: tuple[inspect.Parameter, ...]

    def bind(self, arguments: Mapping[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        """The positional and keyword arguments for ``arguments`` that passed the schema."""
        converter = argument_converter()
        values = {
            name: converter.structure(value, self.hints[name]) for name, value in arguments.items()
        }
        given = [p.name in values for p in self.positional_only]
        last = max((i for i, present in enumerate(given) if present), default=-1)
        args = [values.pop(p.name, p.default) for p in self.positional_only[: last + 1]]
        return args, values


def signature_parameters(function: Callable[..., Any], where: str) -> tuple[dict[str, Any], Binder]:
    """The object schema of ``function``'s arguments and the binder that calls it.

    Raises:
        InvalidRequestError: a parameter without a type, of a type with no
            JSON schema, or ``*args``/``**kwargs``.
    """
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError) as exc:
        raise InvalidRequestError(f"{where}: cannot read its signature ({exc})") from None
    target = function.func if isinstance(function, functools.partial) else function
    hints = type_hints(target, where=where) or type_hints(call_method(target), where=where)
    _, documented = parse_docstring(docstring(function))
    properties: dict[str, Any] = {}
    required: list[str] = []
    parameter_hints: dict[str, Any] = {}
    for parameter in signature.parameters.values():
        hint = _parameter_hint(parameter, hints, f"parameter {parameter.name!r} of {where}")
        schema = schema_for(hint, where=f"parameter {parameter.name!r} of {where}")
        if documented.get(parameter.name):
            schema["description"] = documented[parameter.name]
        if parameter.default is parameter.empty:
            required.append(parameter.name)
        else:
            with_default(schema, parameter.default)
        properties[parameter.name] = schema
        parameter_hints[parameter.name] = hint
    positional_only = tuple(p for p in signature.parameters.values() if p.kind is p.POSITIONAL_ONLY)
    return object_schema(properties, required), Binder(parameter_hints, positional_only)


def _parameter_hint(parameter: inspect.Parameter, hints: Mapping[str, Any], where: str) -> Any:
    if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
        raise InvalidRequestError(
            f"{where}: *args and **kwargs have no JSON schema; "
            "name each argument the model may pass"
        )
    hint = hints.get(parameter.name, parameter.annotation)
    if hint is parameter.empty or isinstance(hint, str):
        raise InvalidRequestError(
            f"{where}: annotate it with its type (typing.Any accepts any JSON)"
        )
    return hint


def docstring(function: Callable[..., Any]) -> str | None:
    """The docstring of ``function``, or of the function a ``functools.partial`` wraps."""
    if isinstance(function, functools.partial):
        function = function.func
    return inspect.getdoc(function)


def call_method(function: object) -> Any:
    """The ``__call__`` of a callable object, whose annotations describe it."""
    return getattr(type(function), "__call__", None)  # noqa: B004 (not a callable() test)
