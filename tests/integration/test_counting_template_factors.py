"""benchmarks/derive_template_prior.py's measure of a chat template's classes.

What a template spends per token of the estimate's ``framing``, ``tool`` and
``tool_result`` classes, counted with o200k and a control marker as one token:
on small templates whose spend is known by hand, and on two of llama.cpp's
(Phi-3.5's shows no tool call or result; Qwen 2.5's shows both).
"""

from __future__ import annotations

import importlib.util
import os
from types import ModuleType

import pytest

from benchmark_modules import load_benchmark

pytestmark = pytest.mark.integration

# Each message as <|im_start|>ROLE\nCONTENT<|im_end|>\n: two markers, the role and two
# line breaks, 5 tokens beside the content where the estimate's framing class holds 4.
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}{{ c.function.name }} {{ c.function.arguments | tojson }}"
    "{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# The same, but tool calls and results are not shown at all.
SILENT = (
    "{% for m in messages %}{% if m.role != 'tool' and not m.tool_calls %}"
    "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
)


def _missing(reason: str) -> None:
    if os.environ.get("THREADLINE_REQUIRE_INTEGRATION") == "1":
        pytest.fail(f"{reason}; THREADLINE_REQUIRE_INTEGRATION=1 makes this a failure")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def derive() -> ModuleType:
    if importlib.util.find_spec("jinja2") is None:
        _missing("jinja2 not installed: pip install -e '.[test]'")
    return load_benchmark("derive_template_prior")


def test_a_template_that_shows_every_message_is_measured_as_written(derive: ModuleType) -> None:
    framing, tool, result = derive.factors(derive.environment().from_string(CHATML))
    assert framing == pytest.approx(5 / 4, abs=0.05)
    assert result == pytest.approx(1.0, abs=0.05)  # a result's text, as it is
    # The call's name and arguments, not its id nor the estimate's 7 + 4 framing tokens.
    assert 0.2 < tool < 0.9


def test_a_template_that_shows_no_tool_message_spends_nothing_on_them(
    derive: ModuleType,
) -> None:
    framing, tool, result = derive.factors(derive.environment().from_string(SILENT))
    assert framing == pytest.approx(5 / 4, abs=0.05)
    assert (tool, result) == (0.0, 0.0)


def test_llama_cpp_templates_are_measured_apart(derive: ModuleType) -> None:
    import _heldout_families as families

    wanted = {"Phi-3", "Qwen 2.5"}
    chosen = tuple(f for f in families.FAMILIES if f.name in wanted)
    try:
        folder = families.vocab_dir(chosen)
    except RuntimeError as exc:
        _missing(f"llama.cpp's templates could not be had: {exc}")
    env = derive.environment()
    measured = {
        f.name: derive.factors(env.from_string((folder / "templates" / f.template).read_text()))
        for f in chosen
    }
    assert measured["Phi-3"][1:] == (0.0, 0.0)  # Phi-3.5's shows no call or result
    assert measured["Qwen 2.5"][2] == pytest.approx(1.0, abs=0.05)
    assert measured["Qwen 2.5"][1] > 0.5


def test_a_tool_calls_markers_spelled_as_text_cost_their_letters(derive: ModuleType) -> None:
    from threadline.counting import o200k_base_encoding

    marker = "<\uff5ctool\u2581call\u2581begin\uff5c>"  # DeepSeek's, as its templates write it
    marked = CHATML.replace("{{ c.function.name }}", marker + "{{ c.function.name }}")
    env = derive.environment()
    plain, spelled = (
        derive.spelled(env.from_string(CHATML)),
        derive.spelled(env.from_string(marked)),
    )
    # Counted as text the marker costs its o200k tokens (give or take a merge with the
    # name) on every call, per token of the tool class of the call and its result.
    Message = derive.Message
    sizes = [
        derive._classes([Message.assistant("", tool_calls=[c]), Message.tool(c.id, r, name="x")])[1]
        for c in derive.CALLS
        for r in derive.RESULTS
    ]
    letters = len(o200k_base_encoding().encode_ordinary(marker))
    assert letters > 5
    assert (letters - 1) / max(sizes) <= spelled - plain <= (letters + 1) / min(sizes)
    # With its markers as one token each, a template spends less than spelled on its calls.
    assert derive.factors(env.from_string(marked))[1] < spelled
