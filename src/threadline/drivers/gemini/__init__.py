"""``GeminiDriver``: the Gemini Developer API, thought signatures kept on their part.

The driver only translates (``_contents``, ``_request``, ``_response``) and
sends (``drivers/_http``: one pooled ``httpx.AsyncClient``, the shared retry
policy, errors mapped to threadline's tree, the shared SSE decoder).

Where it lives: the driver and its exact counter in ``_driver``; the
transcript as Gemini's ``contents`` (the order rules and the thought
signatures) in ``_contents``; the other request fields in ``_request``;
reading answers and streams in ``_response``.
"""

from threadline._public import publish
from threadline.drivers._http import RetryPolicy
from threadline.drivers.gemini._contents import DUMMY_SIGNATURE as DUMMY_SIGNATURE
from threadline.drivers.gemini._contents import GEMINI_REPLAY as GEMINI_REPLAY
from threadline.drivers.gemini._driver import DEFAULT_BASE_URL as DEFAULT_BASE_URL
from threadline.drivers.gemini._driver import GeminiDriver, GeminiTokenCounter
from threadline.drivers.gemini._request import ThinkingConfig

# RetryPolicy is re-exported: it is how this driver's retrying is configured.
__all__ = ["GeminiDriver", "GeminiTokenCounter", "RetryPolicy", "ThinkingConfig"]

publish(globals(), ["GeminiDriver", "GeminiTokenCounter", "ThinkingConfig"], __name__)
