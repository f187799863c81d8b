"""``Model``: a model's name and the sizes that decide its prompt budget.

Known models resolve their window from a catalog: the data of pydantic's
``genai-prices`` package, which ships context windows and list prices for
well over a thousand models inside the package (no network: the bundled data
is read, never fetched). An explicit ``context_size`` always wins over the
catalog; a name the catalog does not know, given no ``context_size``, logs
one WARNING per name on ``threadline.models`` saying that requests to it are
not limited and how to fix that. A window is read from a compact index of
that data (``threadline._catalog``), built once per genai-prices release;
genai-prices itself (and pydantic) is imported only to price a usage.
"""

from __future__ import annotations

import logging
import threading
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import attrs

from threadline._catalog import IndexUnavailable, context_window
from threadline._errors import InvalidRequestError

if TYPE_CHECKING:
    from threadline._messages import Usage

__all__ = ["Model", "catalog_context_size"]

logger = logging.getLogger("threadline.models")

_warned: set[str] = set()
_warned_lock = threading.Lock()


def _catalog_entry(name: str, api_url: str | None = None) -> Any:
    """The catalog's price calculation for ``name`` (``None`` when unknown).

    ``api_url``, when given, must be a provider the catalog knows (a local
    server's URL is not, so nothing is priced there).
    """
    if not name.strip():
        return None
    from genai_prices import Usage as PriceUsage
    from genai_prices import calc_price

    try:
        if api_url is None:
            return calc_price(PriceUsage(input_tokens=0, output_tokens=0), name)
        return calc_price(
            PriceUsage(input_tokens=0, output_tokens=0), name, provider_api_url=api_url
        )
    except LookupError:
        return None


def catalog_context_size(name: str) -> int | None:
    """The context window the catalog gives ``name``, or ``None`` when it has none.

    Example::

        >>> catalog_context_size("gpt-4o-mini")
        128000
    """
    if not name.strip():
        return None
    try:
        return context_window(name)
    except IndexUnavailable:
        pass
    entry = _catalog_entry(name)
    if entry is None:
        return None
    window = entry.model.context_window
    return window if isinstance(window, int) and window > 0 else None


def _window_from_catalog(model: Model) -> int | None:
    name = model.name
    if not isinstance(name, str):
        return None  # the name's own validator reports it
    window = catalog_context_size(name)
    if window is None:
        _warn_unknown_window(name)
    return window


def _warn_unknown_window(name: str) -> None:
    with _warned_lock:
        if name in _warned:
            return
        _warned.add(name)
    logger.warning(
        "model %r has no known context window (the model catalog does not list it and no "
        "context_size was given), so its requests are not limited unless they set "
        "max_context_tokens; give Model(%r, context_size=N) to turn limiting on",
        name,
        name,
    )


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
    ``max_output_tokens`` the most the model will write in one reply: a
    request that leaves its own unset sends this one (and reserves it, unless
    it sets a reserve), and a request asking for more is refused with
    ``InvalidRequestError`` before anything is sent. Left
    out, ``context_size`` comes from the model catalog (``genai-prices``'
    data) for a name it knows; a name it does not know gets ``None``, which
    turns limiting off unless a request sets ``max_context_tokens``, and one
    WARNING per name says so. An explicit value, ``None`` included, is kept
    as given. The catalog has no output ceilings, so ``max_output_tokens`` is
    only what you give.

    Example::

        Model("gpt-4o-mini")                       # context_size 128000, from the catalog
        Model("my-finetune", context_size=32_768)  # a window the catalog cannot know
    """

    name: str = attrs.field(validator=attrs.validators.instance_of(str))
    context_size: int | None = attrs.field(
        default=attrs.Factory(_window_from_catalog, takes_self=True),
        kw_only=True,
        validator=_positive_or_none,
    )
    max_output_tokens: int | None = attrs.field(
        default=None, kw_only=True, validator=_positive_or_none
    )

    def __attrs_post_init__(self) -> None:
        if not self.name.strip():
            raise InvalidRequestError("Model.name must not be empty")

    def cost(self, usage: Usage, *, api_url: str | None = None) -> Decimal | None:
        """What ``usage`` costs at the catalog's list prices, in US dollars.

        ``None`` when the catalog has no price for the name, or when
        ``api_url`` is given and is not a provider the catalog knows (an
        OpenAI-compatible server of your own serving a model of the same
        name costs what it costs you). A list price is an estimate, not a
        bill.

        Example::

            Model("gpt-4o-mini").cost(result.usage, api_url="https://api.openai.com/v1")
        """
        entry = _catalog_entry(self.name, api_url)
        if entry is None:
            return None
        from genai_prices import Usage as PriceUsage

        cached = min(usage.cached_input_tokens, usage.input_tokens)
        priced = entry.model.calc_price(
            PriceUsage(
                input_tokens=usage.input_tokens,
                cache_read_tokens=cached,
                output_tokens=usage.output_tokens,
            ),
            entry.provider,
        )
        total: Decimal = priced.total_price
        return total
