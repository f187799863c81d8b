"""``OpenAIResponsesDriver``: OpenAI's Responses API, with reasoning items replayed exactly.

Reasoning models (o-series, GPT-5) return their reasoning only through the
Responses API. The driver calls it statelessly (``store: false``, the whole
kept transcript as ``input`` items every round), asks for the reasoning's
``encrypted_content``, keeps each reasoning item on the assistant message
that followed it and sends it back byte for byte, so a tool round does not
re-think from nothing. It also speaks to servers that implement the same
API, such as llama.cpp's ``llama-server`` (``/v1/responses``,
``/v1/responses/input_tokens``).

The driver only translates (``_request``, ``_response``) and sends
(``drivers/_http``: the pooled client, the shared retry policy, errors mapped
to threadline's tree, the shared SSE decoder).

Where it lives: the driver and its exact counter in ``_driver``; building
requests in ``_request``; reading answers and streams in ``_response``.
"""

from threadline._public import publish
from threadline.drivers._http import RetryPolicy
from threadline.drivers.openai_responses._driver import DEFAULT_BASE_URL as DEFAULT_BASE_URL
from threadline.drivers.openai_responses._driver import (
    OpenAIResponsesDriver,
    ResponsesTokenCounter,
)
from threadline.drivers.openai_responses._request import REASONING_REPLAY as REASONING_REPLAY

# RetryPolicy is re-exported: it is how this driver's retrying is configured.
__all__ = ["OpenAIResponsesDriver", "ResponsesTokenCounter", "RetryPolicy"]

publish(globals(), ["OpenAIResponsesDriver", "ResponsesTokenCounter"], __name__)
