"""A streamed request with a tool, against any OpenAI-compatible server.

Point it at OpenAI, vLLM, Ollama, LM Studio, llama.cpp or llama-cpp-python::

    python examples/openai_compatible.py --base-url http://127.0.0.1:8080/v1 --model local
    OPENAI_API_KEY=sk-... python examples/openai_compatible.py --model gpt-4o-mini

``--base-url`` defaults to ``$OPENAI_BASE_URL``, then OpenAI's API;
``--model`` to ``$OPENAI_MODEL``. ``OPENAI_API_KEY`` is optional: local
servers need none. ``--force-tool`` sends ``tool_choice`` naming the tool for
the first round, which small local models need before they call anything.

The model gets one tool, ``convert_temperature``; the script streams the
answer as it arrives, shows each tool call and its result, and ends with the
budget ledger: what was sent, what the server reported, what was dropped.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Literal

import anyio

from threadline import (
    Client,
    FinalResult,
    LimitApplied,
    Model,
    RoundDone,
    TextDelta,
    ThreadlineError,
    ToolCallEvent,
    ToolResultEvent,
    tool,
)
from threadline.drivers import OpenAIChatDriver
from threadline.drivers.openai_chat import DEFAULT_BASE_URL


@tool
def convert_temperature(value: float, to: Literal["celsius", "fahrenheit"]) -> str:
    """Convert a temperature between Celsius and Fahrenheit.

    Args:
        value: the temperature to convert.
        to: the scale to convert it to.
    """
    if to == "celsius":
        return f"{value}°F is {(value - 32) * 5 / 9:.1f}°C"
    return f"{value}°C is {value * 9 / 5 + 32:.1f}°F"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--base-url",
        default=os.environ.get("OPENAI_BASE_URL", DEFAULT_BASE_URL),
        help="the API root, /v1 included (default: $OPENAI_BASE_URL, else OpenAI)",
    )
    parser.add_argument(
        "--model",
        default=os.environ.get("OPENAI_MODEL"),
        help="the model name the server knows (default: $OPENAI_MODEL)",
    )
    parser.add_argument(
        "--context-size", type=int, default=8192, help="the model's context window in tokens"
    )
    parser.add_argument(
        "--max-output-tokens", type=int, default=256, help="the most tokens one reply may have"
    )
    parser.add_argument(
        "--force-tool", action="store_true", help="make the first round call the tool"
    )
    parser.add_argument(
        "--prompt",
        default="It is 31 degrees Celsius in Lisbon. What is that in Fahrenheit?",
    )
    args = parser.parse_args()
    if not args.model:
        parser.error("give --model or set OPENAI_MODEL")
    return args


async def main(args: argparse.Namespace) -> None:
    model = Model(args.model, context_size=args.context_size)
    # api_key=None reads OPENAI_API_KEY; unset, no Authorization header is sent.
    driver = OpenAIChatDriver(args.base_url)
    async with Client(driver, default_model=model) as client:
        request = (
            client.request()
            .with_system("You are a concise assistant. Use the tool for conversions.")
            .with_prompt(args.prompt)
            .with_tools([convert_temperature])
            .with_max_output_tokens(args.max_output_tokens)
        )
        if args.force_tool:
            request = request.with_tool_choice("convert_temperature")
        print(f"{driver!r}, model {model.name}, budget {await request.budget()}\n")

        async with request.stream() as events:
            async for event in events:
                if isinstance(event, TextDelta):
                    print(event.text, end="", flush=True)
                elif isinstance(event, ToolCallEvent):
                    print(f"[round {event.round}] calls {event.call.name}({event.call.arguments})")
                elif isinstance(event, ToolResultEvent):
                    marker = "error" if event.is_error else "result"
                    print(f"[round {event.round}] {marker}: {event.message.text}")
                elif isinstance(event, LimitApplied):
                    print(f"[round {event.round}] dropped {len(event.record.dropped)} units")
                elif isinstance(event, RoundDone):
                    record = event.record
                    print(
                        f"\n[round {record.round} done: {record.finish_reason}; "
                        f"estimated {record.estimated_input_tokens} input tokens, "
                        f"server reported {record.reported_input_tokens}]"
                    )
                elif isinstance(event, FinalResult):
                    usage = event.result.usage
                    print(
                        f"\n{len(event.result.rounds)} round(s), "
                        f"{usage.input_tokens} input + {usage.output_tokens} output tokens"
                    )


if __name__ == "__main__":
    arguments = parse_args()
    try:
        anyio.run(main, arguments)
    except ThreadlineError as error:
        sys.exit(f"error: {error}")
