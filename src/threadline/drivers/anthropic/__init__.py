"""``AnthropicDriver``: the Anthropic Messages API, with signed thinking replayed exactly.

The driver only translates (``_request``, ``_response``) and sends
(``drivers/_http``: one pooled ``httpx.AsyncClient``, the shared retry
policy, errors mapped to threadline's tree, the shared SSE decoder). It also
speaks to servers that implement the same API, such as llama.cpp's
``llama-server`` (``/v1/messages``, ``/v1/messages/count_tokens``).

Where it lives: the driver and its exact counter in ``_driver``; building
requests in ``_request``; reading answers and streams in ``_response``.
"""

from threadline._public import publish
from threadline.drivers._http import RetryPolicy
from threadline.drivers.anthropic._driver import ANTHROPIC_VERSION as ANTHROPIC_VERSION
from threadline.drivers.anthropic._driver import DEFAULT_BASE_URL as DEFAULT_BASE_URL
from threadline.drivers.anthropic._driver import DEFAULT_MAX_TOKENS as DEFAULT_MAX_TOKENS
from threadline.drivers.anthropic._driver import AnthropicDriver, AnthropicTokenCounter
from threadline.drivers.anthropic._request import THINKING_REPLAY as THINKING_REPLAY
from threadline.drivers.anthropic._request import Thinking

# RetryPolicy is re-exported: it is how this driver's retrying is configured.
__all__ = ["AnthropicDriver", "AnthropicTokenCounter", "RetryPolicy", "Thinking"]

publish(globals(), ["AnthropicDriver", "AnthropicTokenCounter", "Thinking"], __name__)
