"""The 50-turn conversation ``bench_counting_accuracy.py`` holds with real servers.

Questions and answers in English, German, French, Spanish, Japanese, Russian
and Chinese, code to explain, and tool exchanges (the model is made to call a
tool; the tool answers with JSON, code or text in another language). The
mixture matters: o200k_base and SmolLM2's tokenizer agree on English prose
and part by a factor of three on Cyrillic, so a single ratio between them
drifts as the window's content changes.
"""

# The text is meant to be non-English: full-width punctuation is what Japanese and
# Chinese are written with.
# ruff: noqa: RUF001

from __future__ import annotations

import json

import attrs

from threadline import Tool

__all__ = ["SYSTEM", "TOOLS", "TURNS", "Turn"]

SYSTEM = "You are a concise travel assistant. Answer in one short sentence."

WEATHER = Tool(
    name="get_weather",
    description="The current weather in a city.",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string", "description": "The city's name."}},
        "required": ["city"],
    },
)
SEARCH_CODE = Tool(
    name="search_code",
    description="Find a code snippet in the trip planner's repository.",
    parameters={
        "type": "object",
        "properties": {"query": {"type": "string"}},
        "required": ["query"],
    },
)
LOOKUP_WORD = Tool(
    name="lookup_word",
    description="Look a word up in a bilingual dictionary.",
    parameters={
        "type": "object",
        "properties": {"word": {"type": "string"}, "language": {"type": "string"}},
        "required": ["word", "language"],
    },
)
TOOLS = {tool.name: tool for tool in (WEATHER, SEARCH_CODE, LOOKUP_WORD)}


@attrs.frozen(kw_only=True)
class Turn:
    """One user turn; with ``tool`` the model is made to call it and gets ``result`` back."""

    prompt: str
    kind: str
    tool: str | None = None
    result: str | None = None


def _weather(city: str, temp: float, sky: str) -> str:
    return json.dumps({"city": city, "temperature_c": temp, "sky": sky, "wind_kph": 14})


_CODE = '''def trip_cost(days: int, per_day: float, flights: list[float]) -> float:
    """Total cost of a trip."""
    return days * per_day + sum(flights)'''

TURNS: tuple[Turn, ...] = (
    Turn(kind="en", prompt="Hi! I am planning a trip through Europe and Asia this spring."),
    Turn(kind="en", prompt="In one sentence: what is a token in a language model?"),
    Turn(kind="code", prompt="What does `sorted(set(cities), key=len)[-3:]` return?"),
    Turn(kind="de", prompt="Was ist ein Kontextfenster? Bitte ganz kurz erklären."),
    Turn(
        kind="tool",
        prompt="What is the weather in Oslo right now?",
        tool="get_weather",
        result=_weather("Oslo", 3.5, "light snow"),
    ),
    Turn(kind="ja", prompt="東京でおすすめの朝ごはんは何ですか？短く答えてください。"),
    Turn(kind="ru", prompt="Почему в Москве зимой так рано темнеет? Ответь коротко."),
    Turn(kind="code", prompt="Explain: SELECT city, COUNT(*) FROM trips GROUP BY city;"),
    Turn(kind="fr", prompt="Quelle est la meilleure saison pour visiter Lyon ?"),
    Turn(kind="en", prompt="How many days would you spend in Rome?"),
    Turn(kind="es", prompt="¿Qué plato típico debo probar en Valencia?"),
    Turn(
        kind="tool",
        prompt="Find the function that computes a trip's cost.",
        tool="search_code",
        result=_CODE,
    ),
    Turn(kind="zh", prompt="北京的故宫一般需要参观多长时间？"),
    Turn(kind="en", prompt="Is it worth taking the night train from Vienna to Venice?"),
    Turn(kind="code", prompt="Why does `{c: len(c) for c in cities}` build a dict?"),
    Turn(kind="de", prompt="Wie komme ich vom Flughafen München in die Innenstadt?"),
    Turn(kind="ru", prompt="Какой сувенир привезти из Санкт-Петербурга?"),
    Turn(kind="en", prompt="What should I pack for a week in Lisbon in April?"),
    Turn(
        kind="tool",
        prompt="What does the Japanese word 旅館 mean?",
        tool="lookup_word",
        result="旅館（りょかん）: 日本の伝統的な宿。畳の部屋、温泉、夕食と朝食付き。",
    ),
    Turn(kind="fr", prompt="Comment dit-on « billet aller-retour » en allemand ?"),
    Turn(kind="ja", prompt="京都の紅葉はいつが見頃ですか？"),
    Turn(kind="code", prompt="What is wrong with `for i in range(len(days)): print(days[i])`?"),
    Turn(kind="en", prompt="Which is cheaper in Prague: trams or taxis?"),
    Turn(kind="es", prompt="¿Cuántos días recomiendas para Barcelona?"),
    Turn(
        kind="tool",
        prompt="And the weather in Kyoto?",
        tool="get_weather",
        result=_weather("Kyoto", 14.0, "clear"),
    ),
    Turn(kind="zh", prompt="上海有什么值得一去的博物馆？"),
    Turn(kind="ru", prompt="Нужна ли виза в Японию для граждан Казахстана?"),
    Turn(kind="en", prompt="Summarise my trip so far in one sentence."),
    Turn(kind="de", prompt="Welche Zugverbindung ist von Berlin nach Prag am schnellsten?"),
    Turn(kind="code", prompt="Write a one-line Python expression for the average of prices."),
    Turn(kind="fr", prompt="Faut-il réserver le musée du Louvre à l'avance ?"),
    Turn(
        kind="tool",
        prompt="Look up the Russian word вокзал for me.",
        tool="lookup_word",
        result="вокзал — железнодорожная станция с залом ожидания и кассами; от англ. Vauxhall.",
    ),
    Turn(kind="ja", prompt="大阪で安くておいしい食べ物は？"),
    Turn(kind="en", prompt="Could I do Paris to Amsterdam by train in a morning?"),
    Turn(kind="es", prompt="¿Es seguro caminar de noche por Madrid?"),
    Turn(kind="code", prompt="Explain `json.loads(text)['flights'][0]['price']`."),
    Turn(kind="ru", prompt="Сколько стоит проезд в метро в Москве?"),
    Turn(
        kind="tool",
        prompt="What is the weather in Lima today?",
        tool="get_weather",
        result=_weather("Lima", 19.0, "overcast"),
    ),
    Turn(kind="zh", prompt="去西安旅游最好吃的小吃是什么？"),
    Turn(kind="en", prompt="What is a polite way to ask for the bill in Italy?"),
    Turn(kind="de", prompt="Ist das Wasser aus dem Hahn in Wien trinkbar?"),
    Turn(kind="fr", prompt="Quel quartier choisir pour dormir à Marseille ?"),
    Turn(
        kind="tool",
        prompt="Search the code for how flights are sorted.",
        tool="search_code",
        result="flights.sort(key=lambda f: (f.price, f.departure))  # cheapest first",
    ),
    Turn(kind="ja", prompt="北海道で冬にできるアクティビティを教えてください。"),
    Turn(kind="en", prompt="Do I need cash in Stockholm, or are cards enough?"),
    Turn(kind="ru", prompt="Что посмотреть в Казани за один день?"),
    Turn(kind="code", prompt="What does `itertools.pairwise(stops)` give for a route?"),
    Turn(kind="es", prompt="¿Qué ropa llevo para Sevilla en agosto?"),
    Turn(kind="zh", prompt="杭州西湖一日游怎么安排？"),
    Turn(kind="en", prompt="Thanks! Which city should I visit first?"),
)
assert len(TURNS) == 50
