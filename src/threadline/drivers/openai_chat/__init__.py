"""``OpenAIChatDriver``: the Chat Completions protocol, for OpenAI and every
OpenAI-compatible server (llama.cpp, vLLM, Ollama, LM Studio, ...).

The driver only translates (``_wire``) and sends (``drivers/_http``): one
pooled ``httpx.AsyncClient``, the shared retry policy, errors mapped to
threadline's tree. Display reasoning (``reasoning_content``) is read from
answers and never sent back, as Chat Completions has no way to replay it.

Where it lives: the driver in ``_driver``; the translation to and from the
wire in ``_wire``; the exact counter a llama.cpp server offers in
``_llama_cpp_counting``.
"""

from threadline._public import publish
from threadline.drivers._http import RetryPolicy
from threadline.drivers.openai_chat._driver import DEFAULT_BASE_URL as DEFAULT_BASE_URL
from threadline.drivers.openai_chat._driver import OpenAIChatDriver

# RetryPolicy is re-exported: it is how this driver's retrying is configured.
__all__ = ["OpenAIChatDriver", "RetryPolicy"]

publish(globals(), ["OpenAIChatDriver"], __name__)
