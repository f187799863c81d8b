"""What OpenAI's two APIs share, for the Chat Completions and Responses drivers.

Where the server is (``OPENAI_BASE_URL``, else OpenAI's own), how the key
goes (``OPENAI_API_KEY`` as a bearer token), the account headers
(``openai-organization``, ``openai-project``), and when a call's cache key is
sent as ``prompt_cache_key``: written once here, since the drivers may not
import each other.
"""

from __future__ import annotations

from typing import Final

import attrs
import httpx

from threadline._provider import ProviderCall
from threadline.drivers._http._connection import HTTPConnection, resolve_base_url
from threadline.drivers._http._endpoint import HTTPEndpoint, check_bool, check_optional_str

__all__ = ["OPENAI_BASE_URL", "openai_endpoint", "sends_cache_key", "with_cache_key"]

OPENAI_BASE_URL: Final = "https://api.openai.com/v1"


def openai_endpoint(
    driver: str, connection: HTTPConnection, *, organization: str | None, project: str | None
) -> HTTPEndpoint:
    """``connection`` resolved for an OpenAI API; ``endpoint.base_url`` is the root.

    Raises:
        InvalidRequestError: ``organization`` or ``project`` is not a str or None.
    """
    base_url = resolve_base_url(connection.base_url, env="OPENAI_BASE_URL", default=OPENAI_BASE_URL)
    headers = {"accept": "application/json", "content-type": "application/json"}
    for name, value in (("organization", organization), ("project", project)):
        checked = check_optional_str(name, value)
        if checked:
            headers[f"openai-{name}"] = checked
    return HTTPEndpoint(
        driver,
        connection,
        base_url=base_url,
        api_key_env="OPENAI_API_KEY",
        key_header="authorization",
        key_prefix="Bearer ",
        headers=headers,
    )


def sends_cache_key(base_url: str, send_cache_key: bool | None) -> bool:
    """Whether calls carry ``prompt_cache_key``: as asked, else to OpenAI's own API only
    (some compatible servers refuse fields they do not know).

    Raises:
        InvalidRequestError: ``send_cache_key`` is not a bool or None.
    """
    if send_cache_key is None:
        return httpx.URL(base_url).host == "api.openai.com"
    return check_bool("send_cache_key", send_cache_key)


def with_cache_key(call: ProviderCall, send: bool) -> ProviderCall:
    """``call`` with its ``cache_key`` as ``prompt_cache_key`` when ``send`` says so and
    the call's ``extra_body`` does not set one itself."""
    if send and call.cache_key and "prompt_cache_key" not in call.extra_body:
        return attrs.evolve(
            call, extra_body={**call.extra_body, "prompt_cache_key": call.cache_key}
        )
    return call
