"""A conversation that runs anywhere: a scripted model, a small window, real limiting.

Run it with ``python examples/offline_scripted.py``. Each turn prints the
answer and a status line: tokens sent / prompt budget / reserve, and how many
units limiting dropped to fit.
"""

from __future__ import annotations

import anyio

from threadline import Client, Message, Model
from threadline.testing import ScriptedDriver

QUESTIONS = [
    "My name is Ada and I write compilers.",
    "What is a register allocator? Please be thorough.",
    "And what does graph colouring have to do with it?",
    "Which languages did I say I work on?",
    "What is my name?",
]


async def main() -> None:
    answers = [f"(scripted answer {i + 1}) " + "Here is a detailed reply. " * 12 for i in range(5)]
    driver = ScriptedDriver(answers)
    model = Model("scripted-demo", context_size=600)
    history: list[Message] = []
    async with Client(driver, default_model=model) as client:
        for question in QUESTIONS:
            result = await (
                client.request()
                .with_system("You are a patient teacher.")
                .with_messages(history)
                .with_prompt(question)
                .with_output_reserve_tokens(200)
                .run()
            )
            history = [*history, *result.new_messages()]
            record = result.rounds[-1]
            budget = result.budget
            dropped = sum(len(r.dropped) for r in result.limiting)
            print(f"you> {question}")
            print(f"bot> {result.text[:70]}...")
            if budget is not None:
                print(
                    f"     [{record.estimated_input_tokens} tokens sent / "
                    f"{budget.prompt_tokens} budget / {budget.reserve} reserve; "
                    f"{dropped} unit(s) dropped]"
                )


if __name__ == "__main__":
    anyio.run(main)
