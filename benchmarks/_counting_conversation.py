"""The 50-turn conversation ``bench_counting_accuracy.py`` holds with real servers.

Questions and answers in English, German, French, Spanish, Japanese, Russian
and Chinese, code to explain, and seven tool exchanges (a call, a result of
JSON, code or text in another language, an answer). The mixture matters:
o200k_base and SmolLM2's tokenizer agree on English prose and part by a
factor of three on Cyrillic, so a single ratio between them drifts as the
window's content changes.

The first three turns, which calibration learns from before it is judged,
hold English, Russian and Japanese, as the rest of the conversation does.
The answers and tool calls are scripted: what is measured is counting, and a
135M model's own replies would make every run a different conversation.
Every prompt is still sent to the server, which counts it and answers.
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
    """One user turn and its answer; with ``tool``, the assistant first calls it with
    ``arguments`` and gets ``result`` back."""

    prompt: str
    kind: str
    answer: str
    tool: str | None = None
    arguments: str = "{}"
    result: str = ""


def _weather(city: str, temp: float, sky: str) -> str:
    return json.dumps({"city": city, "temperature_c": temp, "sky": sky, "wind_kph": 14})


_CODE = '''def trip_cost(days: int, per_day: float, flights: list[float]) -> float:
    """Total cost of a trip."""
    return days * per_day + sum(flights)'''

TURNS: tuple[Turn, ...] = (
    Turn(
        kind="en",
        prompt="Hi! I am planning a trip through Europe and Asia this spring.",
        answer="Lovely! Spring is a fine time for both; tell me the cities you have in mind.",
    ),
    Turn(
        kind="ru",
        prompt="Почему в Москве зимой так рано темнеет? Ответь коротко.",
        answer="Москва находится далеко на севере, поэтому зимой день очень короткий.",
    ),
    Turn(
        kind="ja",
        prompt="東京でおすすめの朝ごはんは何ですか？短く答えてください。",
        answer="卵かけご飯と味噌汁、焼き魚の定食がおすすめです。",
    ),
    Turn(
        kind="en",
        prompt="In one sentence: what is a token in a language model?",
        answer="A token is a piece of text, often part of a word, that the model reads as one.",
    ),
    Turn(
        kind="code",
        prompt="What does `sorted(set(cities), key=len)[-3:]` return?",
        answer="It returns the three longest distinct city names, shortest of the three first.",
    ),
    Turn(
        kind="de",
        prompt="Was ist ein Kontextfenster? Bitte ganz kurz erklären.",
        answer="Das Kontextfenster ist die Menge an Text, die ein Modell auf einmal lesen kann.",
    ),
    Turn(
        kind="tool",
        prompt="What is the weather in Oslo right now?",
        tool="get_weather",
        arguments='{"city": "Oslo"}',
        result=_weather("Oslo", 3.5, "light snow"),
        answer="Oslo has light snow at 3.5 °C with a 14 km/h wind: bring a warm coat.",
    ),
    Turn(
        kind="code",
        prompt="Explain: SELECT city, COUNT(*) FROM trips GROUP BY city;",
        answer="It counts the trips per city: one row for each city with its number of trips.",
    ),
    Turn(
        kind="fr",
        prompt="Quelle est la meilleure saison pour visiter Lyon ?",
        answer="Le printemps et le début de l'automne sont idéaux pour visiter Lyon.",
    ),
    Turn(
        kind="en",
        prompt="How many days would you spend in Rome?",
        answer="Three days are enough for the main sights; four with the Vatican museums.",
    ),
    Turn(
        kind="es",
        prompt="¿Qué plato típico debo probar en Valencia?",
        answer="Prueba la paella valenciana, mejor en un restaurante junto a la playa.",
    ),
    Turn(
        kind="tool",
        prompt="Find the function that computes a trip's cost.",
        tool="search_code",
        arguments='{"query": "trip cost"}',
        result=_CODE,
        answer="It is trip_cost(days, per_day, flights): days times the daily cost plus flights.",
    ),
    Turn(
        kind="zh",
        prompt="北京的故宫一般需要参观多长时间？",
        answer="参观故宫一般需要三到四个小时。",
    ),
    Turn(
        kind="en",
        prompt="Is it worth taking the night train from Vienna to Venice?",
        answer="Yes: you sleep on the way and arrive in Venice in the morning, saving a night.",
    ),
    Turn(
        kind="code",
        prompt="Why does `{c: len(c) for c in cities}` build a dict?",
        answer="The braces with a colon make a dict comprehension: each city maps to its length.",
    ),
    Turn(
        kind="de",
        prompt="Wie komme ich vom Flughafen München in die Innenstadt?",
        answer="Nehmen Sie die S-Bahn S1 oder S8; sie fährt in etwa 40 Minuten ins Zentrum.",
    ),
    Turn(
        kind="ru",
        prompt="Какой сувенир привезти из Санкт-Петербурга?",
        answer="Привезите матрёшку или фарфор Императорского завода.",
    ),
    Turn(
        kind="en",
        prompt="What should I pack for a week in Lisbon in April?",
        answer="Light layers, a rain jacket and comfortable shoes for the hills.",
    ),
    Turn(
        kind="tool",
        prompt="What does the Japanese word 旅館 mean?",
        tool="lookup_word",
        arguments='{"word": "旅館", "language": "ja"}',
        result="旅館（りょかん）: 日本の伝統的な宿。畳の部屋、温泉、夕食と朝食付き。",
        answer="A ryokan is a traditional Japanese inn with tatami rooms, hot baths and meals.",
    ),
    Turn(
        kind="fr",
        prompt="Comment dit-on « billet aller-retour » en allemand ?",
        answer="Auf Deutsch sagt man « Hin- und Rückfahrkarte ».",
    ),
    Turn(
        kind="ja",
        prompt="京都の紅葉はいつが見頃ですか？",
        answer="京都の紅葉は十一月中旬から下旬が見頃です。",
    ),
    Turn(
        kind="code",
        prompt="What is wrong with `for i in range(len(days)): print(days[i])`?",
        answer="Nothing is wrong, but `for day in days: print(day)` is shorter and clearer.",
    ),
    Turn(
        kind="en",
        prompt="Which is cheaper in Prague: trams or taxis?",
        answer="Trams: a 24-hour ticket costs less than one taxi ride across town.",
    ),
    Turn(
        kind="es",
        prompt="¿Cuántos días recomiendas para Barcelona?",
        answer="Tres o cuatro días bastan para Barcelona.",
    ),
    Turn(
        kind="tool",
        prompt="And the weather in Kyoto?",
        tool="get_weather",
        arguments='{"city": "Kyoto"}',
        result=_weather("Kyoto", 14.0, "clear"),
        answer="Kyoto is clear at 14 °C: a good day for the temples.",
    ),
    Turn(
        kind="zh",
        prompt="上海有什么值得一去的博物馆？",
        answer="上海博物馆和中华艺术宫都很值得一去。",
    ),
    Turn(
        kind="ru",
        prompt="Нужна ли виза в Японию для граждан Казахстана?",
        answer="Да, для краткой поездки гражданам Казахстана виза в Японию нужна.",
    ),
    Turn(
        kind="en",
        prompt="Summarise my trip so far in one sentence.",
        answer="You are touring Europe and Asia: Rome, Lisbon, Prague, Tokyo and Kyoto so far.",
    ),
    Turn(
        kind="de",
        prompt="Welche Zugverbindung ist von Berlin nach Prag am schnellsten?",
        answer="Der Direktzug Berlin–Prag braucht etwa vier Stunden und ist am schnellsten.",
    ),
    Turn(
        kind="code",
        prompt="Write a one-line Python expression for the average of prices.",
        answer="`sum(prices) / len(prices)` gives the average of the prices.",
    ),
    Turn(
        kind="fr",
        prompt="Faut-il réserver le musée du Louvre à l'avance ?",
        answer="Oui, il vaut mieux réserver un créneau en ligne à l'avance.",
    ),
    Turn(
        kind="tool",
        prompt="Look up the Russian word вокзал for me.",
        tool="lookup_word",
        arguments='{"word": "вокзал", "language": "ru"}',
        result="вокзал — железнодорожная станция с залом ожидания и кассами; от англ. Vauxhall.",
        answer="A вокзал is a railway station with a waiting hall and ticket offices.",
    ),
    Turn(
        kind="ja",
        prompt="大阪で安くておいしい食べ物は？",
        answer="たこ焼きとお好み焼きが安くておいしいです。",
    ),
    Turn(
        kind="en",
        prompt="Could I do Paris to Amsterdam by train in a morning?",
        answer="Yes: the Thalys takes about three and a half hours from Paris to Amsterdam.",
    ),
    Turn(
        kind="es",
        prompt="¿Es seguro caminar de noche por Madrid?",
        answer="Sí, Madrid es bastante segura de noche en las zonas céntricas.",
    ),
    Turn(
        kind="code",
        prompt="Explain `json.loads(text)['flights'][0]['price']`.",
        answer="It parses the JSON text and takes the price of the first flight.",
    ),
    Turn(
        kind="ru",
        prompt="Сколько стоит проезд в метро в Москве?",
        answer="Одна поездка в московском метро стоит около 60 рублей.",
    ),
    Turn(
        kind="tool",
        prompt="What is the weather in Lima today?",
        tool="get_weather",
        arguments='{"city": "Lima"}',
        result=_weather("Lima", 19.0, "overcast"),
        answer="Lima is overcast at 19 °C: a light jacket is enough.",
    ),
    Turn(
        kind="zh",
        prompt="去西安旅游最好吃的小吃是什么？",
        answer="去西安一定要尝尝肉夹馍和羊肉泡馍。",
    ),
    Turn(
        kind="en",
        prompt="What is a polite way to ask for the bill in Italy?",
        answer="Say « il conto, per favore » and the waiter will bring the bill.",
    ),
    Turn(
        kind="de",
        prompt="Ist das Wasser aus dem Hahn in Wien trinkbar?",
        answer="Ja, das Leitungswasser in Wien ist sehr gut und trinkbar.",
    ),
    Turn(
        kind="fr",
        prompt="Quel quartier choisir pour dormir à Marseille ?",
        answer="Choisissez le Vieux-Port ou le Panier pour être près de tout.",
    ),
    Turn(
        kind="tool",
        prompt="Search the code for how flights are sorted.",
        tool="search_code",
        arguments='{"query": "sort flights"}',
        result="flights.sort(key=lambda f: (f.price, f.departure))  # cheapest first",
        answer="They are sorted by price, then departure time: the cheapest first.",
    ),
    Turn(
        kind="ja",
        prompt="北海道で冬にできるアクティビティを教えてください。",
        answer="スキーやスノーボード、流氷ウォークが楽しめます。",
    ),
    Turn(
        kind="en",
        prompt="Do I need cash in Stockholm, or are cards enough?",
        answer="Cards work almost everywhere in Stockholm; you rarely need cash.",
    ),
    Turn(
        kind="ru",
        prompt="Что посмотреть в Казани за один день?",
        answer="Посмотрите Кремль, мечеть Кул-Шариф и улицу Баумана.",
    ),
    Turn(
        kind="code",
        prompt="What does `itertools.pairwise(stops)` give for a route?",
        answer="It yields consecutive pairs of stops: each leg of the route.",
    ),
    Turn(
        kind="es",
        prompt="¿Qué ropa llevo para Sevilla en agosto?",
        answer="Lleva ropa ligera de algodón, sombrero y protector solar.",
    ),
    Turn(
        kind="zh",
        prompt="杭州西湖一日游怎么安排？",
        answer="上午游苏堤和断桥，下午坐船游湖，傍晚看雷峰塔。",
    ),
    Turn(
        kind="en",
        prompt="Thanks! Which city should I visit first?",
        answer="Start with Lisbon: the weather is mild and it is the westernmost city.",
    ),
)
assert len(TURNS) == 50
