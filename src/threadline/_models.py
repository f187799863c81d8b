"""``Model``: a model's name and the sizes that decide its prompt budget."""

from __future__ import annotations

import attrs

from threadline._errors import InvalidRequestError

__all__ = ["Model"]


def _positive_or_none(
    instance: object, attribute: attrs.Attribute[int | None], value: int | None
) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidRequestError(f"Model.{attribute.name} must be a positive int, not {value!r}")


@attrs.frozen(cache_hash=True)
class Model:
    """A model as the SDK needs to know it.

    ``context_size`` is the whole window (prompt and reply together);
    ``max_output_tokens`` the most the model will write in one reply. Either
    may be unknown (``None``); see the budget rules in docs/limiting.md.

    Example::

        Model("gpt-4o-mini", context_size=128_000, max_output_tokens=16_384)
    """

    name: str = attrs.field(validator=attrs.validators.instance_of(str))
    context_size: int | None = attrs.field(default=None, kw_only=True, validator=_positive_or_none)
    max_output_tokens: int | None = attrs.field(
        default=None, kw_only=True, validator=_positive_or_none
    )

    def __attrs_post_init__(self) -> None:
        if not self.name.strip():
            raise InvalidRequestError("Model.name must not be empty")
