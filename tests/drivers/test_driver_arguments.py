"""Every driver refuses a bad constructor argument at once, naming it; base URLs come from the
environment as the official clients read them."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import attrs
import httpx
import pytest

from threadline import InvalidRequestError
from threadline.drivers import (
    AnthropicDriver,
    HTTPConnection,
    LocalDriver,
    OpenAIChatDriver,
    RetryPolicy,
)

HTTP_DRIVERS: dict[str, Callable[..., Any]] = {
    "openai": lambda **kw: OpenAIChatDriver(kw.pop("base_url", "http://127.0.0.1:8080/v1"), **kw),
    "anthropic": lambda **kw: AnthropicDriver(**{"base_url": "http://127.0.0.1:8080", **kw}),
}


@pytest.fixture(autouse=True)
def no_provider_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(params=sorted(HTTP_DRIVERS))
def make(request: pytest.FixtureRequest) -> Callable[..., Any]:
    return HTTP_DRIVERS[request.param]


def refused(make: Callable[..., Any], **arguments: Any) -> str:
    with pytest.raises(InvalidRequestError) as caught:
        make(**arguments)
    return str(caught.value)


# --- base_url ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://[::1", "Invalid port"),
        ("localhost:8080/v1", "scheme"),
        ("127.0.0.1:8080", "no scheme"),
        ("ftp://example.com/v1", "scheme is 'ftp'"),
        ("http:///v1", "no host"),
        ("http://example.com:99999/v1", "out of range"),
        ("", "no scheme"),
    ],
)
def test_a_base_url_that_is_no_http_url_is_refused_naming_it(
    make: Callable[..., Any], url: str, why: str
) -> None:
    message = refused(make, base_url=url)
    assert message.startswith("base_url must be an http:// or https:// URL")
    assert why in message


def test_a_base_url_of_another_type_is_refused(make: Callable[..., Any]) -> None:
    assert "base_url must be a str" in refused(make, base_url=8080)


def test_the_refusal_of_a_base_url_never_shows_its_password_or_query(
    make: Callable[..., Any],
) -> None:
    message = refused(make, base_url="ftp://user:hunter2-password@example.com/v1?key=sk-query")
    assert "hunter2-password" not in message
    assert "sk-query" not in message
    assert "***@example.com" in message
    without_scheme = refused(make, base_url="user:hunter2-password@localhost:8080/v1")
    assert "hunter2-password" not in without_scheme


@pytest.mark.parametrize(
    ("driver", "variable"), [("openai", "OPENAI_BASE_URL"), ("anthropic", "ANTHROPIC_BASE_URL")]
)
def test_a_bad_base_url_from_the_environment_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, driver: str, variable: str
) -> None:
    monkeypatch.setenv(variable, "http://[::1")
    build = OpenAIChatDriver if driver == "openai" else AnthropicDriver
    with pytest.raises(InvalidRequestError, match=f"^{variable} must be an http"):
        build()


@pytest.mark.anyio
async def test_openai_reads_its_base_url_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9999/v1/")
    async with OpenAIChatDriver() as driver:
        assert (
            repr(driver) == "OpenAIChatDriver(base_url='http://127.0.0.1:9999/v1', api_key=<unset>)"
        )
    async with OpenAIChatDriver("http://10.0.0.1:8000/v1") as explicit:
        assert "10.0.0.1:8000" in repr(explicit)  # the argument wins over the environment
    monkeypatch.setenv("OPENAI_BASE_URL", "")
    async with OpenAIChatDriver() as unset:
        assert "https://api.openai.com/v1" in repr(unset)  # empty is unset


@pytest.mark.anyio
async def test_openai_sends_to_the_environments_base_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://llama.example/v1")
    seen: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        message = {"role": "assistant", "content": "ok"}
        return httpx.Response(
            200, json={"choices": [{"message": message, "finish_reason": "stop"}]}
        )

    from threadline import Client, Model

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as http_client:
        driver = OpenAIChatDriver(http_client=http_client)
        client = Client(driver, default_model=Model("m", context_size=4096))
        assert (await client.request().with_prompt("hi").run()).text == "ok"
    assert seen == ["http://llama.example/v1/chat/completions"]


@pytest.mark.anyio
async def test_anthropic_reads_its_base_url_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9998/")
    async with AnthropicDriver() as driver:
        assert "http://127.0.0.1:9998" in repr(driver)
    async with AnthropicDriver(base_url="http://10.0.0.2:8080") as explicit:
        assert "10.0.0.2:8080" in repr(explicit)


# --- retries, time-outs, clock ---------------------------------------------------------


def test_the_retry_policy_class_instead_of_an_instance_is_refused(
    make: Callable[..., Any],
) -> None:
    message = refused(make, retry_policy=RetryPolicy)
    assert message.startswith("retry_policy must be a RetryPolicy instance")
    assert "RetryPolicy(max_retries=3)" in message


@pytest.mark.parametrize("policy", ["fast", 3, {"max_retries": 1}])
def test_a_retry_policy_of_another_kind_is_refused(make: Callable[..., Any], policy: Any) -> None:
    assert refused(make, retry_policy=policy).startswith("retry_policy must be a RetryPolicy")


@pytest.mark.parametrize("count", [-1, True, 1.5, "2"])
def test_a_bad_max_retries_is_refused(make: Callable[..., Any], count: Any) -> None:
    assert refused(make, max_retries=count).startswith("max_retries must be an int of 0 or more")


@pytest.mark.parametrize(
    "timeout",
    [-1, 0, math.nan, math.inf, True, "30", httpx.Timeout(-1.0), httpx.Timeout(5.0, read=math.nan)],
)
def test_a_bad_timeout_is_refused(make: Callable[..., Any], timeout: Any) -> None:
    assert refused(make, timeout=timeout).startswith("timeout must be")


@pytest.mark.anyio
@pytest.mark.parametrize("seconds", [30, 2.5, None, httpx.Timeout(10.0, connect=2.0)])
async def test_good_timeouts_are_accepted(make: Callable[..., Any], seconds: Any) -> None:
    await make(timeout=seconds).aclose()


def test_a_clock_without_now_and_sleep_is_refused(make: Callable[..., Any]) -> None:
    assert refused(make, clock=object()).startswith("clock must be")


# --- credentials, headers, client ---------------------------------------------------------


def test_an_api_key_of_another_type_is_refused_without_being_shown(
    make: Callable[..., Any],
) -> None:
    message = refused(make, api_key=b"sk-bytes-key-0123456789")
    assert message == "api_key must be a str or None, not bytes"


@pytest.mark.parametrize(
    ("headers", "named"),
    [
        ("x-api-key: secret", "default_headers must be a mapping"),
        ({"x-token": 12345678}, "default_headers['x-token'] must be a str, not int"),
        ({1: "value"}, "a header name must be a non-empty str"),
        ({"": "value"}, "a header name must be a non-empty str"),
        ({"x-trace": "a\r\nx-injected: 1"}, "cannot hold CR, LF or NUL"),
    ],
)
def test_bad_default_headers_are_refused(
    make: Callable[..., Any], headers: Any, named: str
) -> None:
    message = refused(make, default_headers=headers)
    assert named in message
    assert "secret" not in message
    assert "12345678" not in message


def test_a_synchronous_http_client_is_refused(make: Callable[..., Any]) -> None:
    with httpx.Client() as sync_client:
        message = refused(make, http_client=sync_client)
    assert "http_client must be an httpx.AsyncClient" in message
    assert "synchronous" in message


# --- the connection ------------------------------------------------------------------------


@pytest.mark.anyio
async def test_drivers_share_one_connection_and_leave_its_client_open(
    make: Callable[..., Any],
) -> None:
    async with httpx.AsyncClient() as http_client:
        shared = HTTPConnection(http_client=http_client, max_retries=0, api_key="sk-shared")
        driver = make(connection=shared)
        assert driver.connection.http_client is http_client
        assert driver.retry_policy.max_retries == 0
        assert "api_key=<set>" in repr(driver)
        await driver.aclose()
        assert not http_client.is_closed


@pytest.mark.anyio
async def test_a_keyword_overrides_that_field_of_the_connection(make: Callable[..., Any]) -> None:
    policy = RetryPolicy(max_retries=5, initial_delay=2.0)
    driver = make(connection=HTTPConnection(retry_policy=policy, timeout=3.0), max_retries=1)
    assert driver.retry_policy == RetryPolicy(max_retries=1, initial_delay=2.0)
    assert driver.connection.timeout == 3.0
    await driver.aclose()


@pytest.mark.anyio
async def test_the_connections_key_wins_over_the_environment(
    monkeypatch: pytest.MonkeyPatch, make: Callable[..., Any]
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-from-env")
    driver = make(connection=HTTPConnection(api_key="sk-given"))
    request = driver._http.request("http://127.0.0.1:8080/v1/x", b"{}", stream=False)
    sent = " ".join(request.headers.values())
    assert "sk-given" in sent
    assert "sk-from-env" not in sent
    await driver.aclose()


def test_a_connection_never_shows_its_key_a_password_or_a_credential_header() -> None:
    connection = HTTPConnection(
        base_url="http://user:hunter2-password@127.0.0.1:8080/v1?key=sk-query",
        api_key="sk-connection-key",
        default_headers={"Authorization": "Bearer sk-header-key", "x-trace": "t-1"},
    )
    shown = repr(connection)
    for secret in ("sk-connection-key", "hunter2-password", "sk-query", "sk-header-key"):
        assert secret not in shown
    assert "'x-trace': 't-1'" in shown
    assert connection.api_key is not None
    assert connection.api_key.reveal() == "sk-connection-key"


def test_a_connection_is_a_value() -> None:
    assert HTTPConnection(api_key="k", max_retries=3) == HTTPConnection(api_key="k", max_retries=3)
    assert HTTPConnection(api_key="k") != HTTPConnection(api_key="other")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        HTTPConnection().timeout = 3.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"timeout": -1}, "timeout must be"),
        ({"retry_policy": RetryPolicy}, "retry_policy must be a RetryPolicy instance"),
        ({"base_url": "localhost:8080/v1"}, "base_url must be an http:// or https:// URL"),
        ({"api_key": 12345}, "api_key must be a str or None, not int"),
        ({"transport": "curl"}, "transport must be 'auto', 'httpx' or 'aiohttp'"),
    ],
)
def test_a_connection_refuses_a_bad_field_naming_it(arguments: dict[str, Any], named: str) -> None:
    with pytest.raises(InvalidRequestError, match=named):
        HTTPConnection(**arguments)


def test_a_connection_of_another_kind_is_refused(make: Callable[..., Any]) -> None:
    assert refused(make, connection={"timeout": 3}).startswith(
        "connection must be an HTTPConnection"
    )


def test_a_keyword_that_is_no_connection_field_is_a_type_error(make: Callable[..., Any]) -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'tiemout'"):
        make(tiemout=3)


# --- each driver's own options ------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"organization": 7}, "organization must be a str or None"),
        ({"project": ["p"]}, "project must be a str or None"),
        ({"stream_usage": "yes"}, "stream_usage must be True or False"),
        ({"send_cache_key": 1}, "send_cache_key must be True or False"),
        ({"max_tokens_field": "max_output_tokens"}, "max_tokens_field must be"),
    ],
)
def test_openai_refuses_its_own_bad_options(arguments: dict[str, Any], named: str) -> None:
    with pytest.raises(InvalidRequestError, match=named):
        OpenAIChatDriver("http://127.0.0.1:8080/v1", **arguments)


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"default_max_tokens": 0}, "default_max_tokens must be a positive int"),
        ({"thinking": {"type": "enabled"}}, "thinking must be a Thinking"),
        ({"betas": "prompt-caching-2024"}, "betas must be a sequence of str"),
        ({"betas": [1]}, "betas must be a sequence of str"),
        ({"anthropic_version": ""}, "anthropic_version must be a non-empty str"),
        ({"prompt_caching": None}, "prompt_caching must be True or False"),
    ],
)
def test_anthropic_refuses_its_own_bad_options(arguments: dict[str, Any], named: str) -> None:
    with pytest.raises(InvalidRequestError, match=named):
        AnthropicDriver(base_url="http://127.0.0.1:8080", **arguments)


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"model_path": 123}, "model_path must be a str or os.PathLike"),
        ({"threads": 0}, "threads must be a positive int"),
        ({"threads": "4"}, "threads must be a positive int"),
        ({"seed": "42"}, "seed must be an int or None"),
        ({"verbose": "no"}, "verbose must be True or False"),
        ({"extra_buffers": None}, "extra_buffers must be True or False"),
    ],
)
def test_the_local_driver_refuses_bad_options(arguments: dict[str, Any], named: str) -> None:
    # Checked before llama-cpp-python is even looked for: no model is loaded.
    with pytest.raises(InvalidRequestError, match=named):
        LocalDriver(**arguments)
