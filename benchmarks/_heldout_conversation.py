"""The 60-turn conversation ``bench_counting_heldout.py`` holds with every tokenizer family.

Twelve scripts and notations, each priced differently by different
vocabularies: English and German (Latin), Russian (Cyrillic), Chinese and
Japanese (CJK), Korean (Hangul), Arabic, Hebrew, Hindi (Devanagari), Thai,
Greek, emoji, and text that is mostly digits and punctuation (CSV, JSON,
code). Every fourth turn is a tool exchange whose result is JSON, CSV, code or
text in another script. The first three turns mix English, Russian and
Chinese, as a user's first turns might; the other scripts first appear
later, one by one, which is what a calibration meets in use: a class it has
never seen a report of, priced at the window's edge.

The turns are built from a few sentences per script (so every run, and every
family, sees the same conversation); the turn number is written into each,
so no two turns are the same text.
"""

# The text is meant to be non-English: full-width punctuation is what Chinese and
# Japanese are written with.
# ruff: noqa: RUF001

from __future__ import annotations

import json
import random
from collections.abc import Sequence

import attrs

__all__ = ["SYSTEM", "TURNS", "Turn", "conversation", "lookup", "weather"]

SYSTEM = (
    "You are a travel assistant for a team that works in many languages. Answer in the "
    "language of the question, briefly, and use the tools when a fact is needed."
)


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


_TEXT: dict[str, tuple[tuple[str, str], ...]] = {
    "en": (
        (
            "We land in Lisbon at {n}:40 on Friday. What should we see first, and is the "
            "tram to the castle worth the queue?",
            "Start with Alfama on foot and take tram 28 early in the morning, before the "
            "queue builds; the castle view at sunset is worth the climb.",
        ),
        (
            "Trip note {n}: compare the night train to Vienna with a morning flight for a "
            "family of four, counting the hotel night we would save.",
            "The night train costs a little more than the flight but saves a hotel night and "
            "the airport transfers, so for four people it comes out cheaper overall.",
        ),
    ),
    "de": (
        (
            "Wie komme ich am schnellsten vom Flughafen München zum Hauptbahnhof? Frage {n}.",
            "Nehmen Sie die S-Bahn S1 oder S8; sie fährt etwa alle zehn Minuten und braucht "
            "rund vierzig Minuten bis zum Hauptbahnhof.",
        ),
    ),
    "ru": (
        (
            "Вопрос {n}: какой музей в Санкт-Петербурге стоит посетить зимой, если у нас "
            "только один свободный день?",
            "Выберите Эрмитаж: приходите к открытию, начните с Зимнего дворца и оставьте "
            "время на импрессионистов в Главном штабе.",
        ),
        (
            "Сколько стоит билет на поезд из Москвы в Казань и сколько часов ехать? ({n})",
            "Скоростной поезд идёт около двенадцати часов, билет в купе стоит от четырёх "
            "тысяч рублей.",
        ),
    ),
    "zh": (
        (
            "第{n}个问题：北京的故宫一般需要参观多长时间？周末人多吗？",
            "参观故宫一般需要三到四个小时，周末和节假日人很多，最好提前在网上预约门票。",
        ),
        (
            "从上海到杭州坐高铁要多久？车票大概多少钱？（{n}）",
            "高铁大约一个小时，二等座票价在七十元左右，车次很多，不需要提前太久购买。",
        ),
    ),
    "ja": (
        (
            "京都の紅葉はいつが見頃ですか？混雑を避けるコツも教えてください。（{n}）",
            "京都の紅葉は十一月中旬から下旬が見頃です。早朝に出かけると混雑を避けられます。",
        ),
    ),
    "ko": (
        (
            "서울에서 부산까지 KTX로 얼마나 걸리나요? 질문 {n}번입니다.",
            "KTX로 약 두 시간 반 정도 걸리고, 주말에는 미리 예매하는 것이 좋습니다.",
        ),
        (
            "제주도에서 꼭 먹어야 할 음식은 무엇인가요? ({n})",
            "흑돼지 구이와 고기국수, 그리고 한라봉을 꼭 드셔 보세요.",
        ),
    ),
    "ar": (
        (
            "السؤال {n}: ما هو أفضل وقت لزيارة مدينة مراكش، وهل الصيف حار جداً؟",
            "أفضل وقت لزيارة مراكش هو الربيع أو الخريف، أما الصيف فحار جداً وتتجاوز الحرارة "
            "أربعين درجة.",
        ),
        (
            "كم يستغرق القطار من الرباط إلى طنجة؟ ({n})",
            "يستغرق القطار السريع البراق حوالي ساعة وعشرين دقيقة من الرباط إلى طنجة.",
        ),
    ),
    "he": (
        (
            "שאלה {n}: איך מגיעים משדה התעופה בן גוריון לירושלים בשבת?",
            "בשבת הרכבת לא נוסעת, אז כדאי להזמין מונית שירות או מונית רגילה מראש.",
        ),
    ),
    "hi": (
        (
            "प्रश्न {n}: दिल्ली से आगरा जाने का सबसे अच्छा तरीका क्या है? ताजमहल कब खुलता है?",
            "गतिमान एक्सप्रेस से लगभग एक घंटा चालीस मिनट लगते हैं; ताजमहल सूर्योदय से खुलता "
            "है और शुक्रवार को बंद रहता है।",
        ),
        (
            "जयपुर में दो दिन में क्या-क्या देख सकते हैं? ({n})",
            "आमेर किला, हवा महल, सिटी पैलेस और जंतर मंतर दो दिन में आराम से देखे जा सकते हैं।",
        ),
    ),
    "th": (
        (
            "คำถามที่ {n}: จากกรุงเทพไปเชียงใหม่ควรนั่งรถไฟหรือเครื่องบินดีครับ",
            "ถ้าอยากประหยัดเวลาควรนั่งเครื่องบิน ใช้เวลาประมาณหนึ่งชั่วโมง แต่รถไฟนอนก็สนุกและได้ชมวิว",
        ),
    ),
    "el": (
        (
            "Ερώτηση {n}: πόσες μέρες χρειάζονται για την Αθήνα και ποια νησιά είναι κοντά;",
            "Τρεις μέρες αρκούν για την Αθήνα· η Αίγινα και η Ύδρα είναι κοντά με το πλοίο "
            "από τον Πειραιά.",
        ),
    ),
    "emoji": (
        (
            "Packing list #{n} 🎒: 👕👕👖🧦🧦🩳 + 🪥🧴 + 🔌📱💻 ... anything missing? 🤔",
            "Add 🧥 for the evenings, 💊 and 🩹 just in case, and a 🔋 power bank ✅👍",
        ),
    ),
    "data": (
        (
            "Check row {n} of this CSV: date,city,eur\\n2026-04-0{d},Porto,118.50\\n"
            "2026-04-1{d},Braga,96.20\\n2026-04-2{d},Faro,142.75",
            "The rows add up to 357.45 EUR; Faro (142.75) is the most expensive night and "
            "Braga (96.20) the cheapest.",
        ),
        (
            'Is this valid JSON? {{"trip": {n}, "legs": [[38.72, -9.14], [41.15, -8.61]], '
            '"ok": true, "tags": ["rail", "sea"]}}',
            'Yes, it is valid: "legs" holds two [lat, lon] pairs, and "ok" is a boolean.',
        ),
        (
            "What does `sum(x * 1.21 for x in prices if x > {n})` compute?",
            "It adds up the prices above that threshold, each with 21% VAT added.",
        ),
    ),
}

_KINDS = ("en", "ru", "zh", "data", "ar", "ko", "de", "hi", "emoji", "th", "he", "ja", "el")
"""The order the scripts take turns in: English, Russian and Chinese first."""


def weather(city: str, temperature: float, sky: str) -> str:
    return json.dumps(
        {"city": city, "temperature_c": temperature, "sky": sky, "wind_kph": 14, "uv": 3}
    )


_CODE = '''def nights_between(check_in: date, check_out: date) -> int:
    """Nights of a stay; 0 when the dates are reversed."""
    return max(0, (check_out - check_in).days)'''

_TOOL_TURNS: tuple[tuple[str, str, str, str, str], ...] = (
    # (tool, arguments, result, prompt, answer)
    (
        "get_weather",
        '{"city": "Oslo"}',
        weather("Oslo", -3.5, "light snow"),
        "What is the weather in Oslo right now?",
        "Oslo has light snow at −3.5 °C: bring a warm coat and boots.",
    ),
    (
        "lookup",
        '{"query": "hotel prices Kyoto"}',
        "hotel,area,jpy\nSakura Inn,Gion,18400\nKamo House,Demachi,12900\nTōji Stay,Minami,9800",
        "Which Kyoto hotel in the list is cheapest?",
        "Tōji Stay in Minami, at 9,800 JPY a night.",
    ),
    (
        "lookup",
        '{"query": "nights_between source"}',
        _CODE,
        "Find the function that counts the nights of a stay.",
        "It is nights_between(check_in, check_out), never below 0.",
    ),
    (
        "lookup",
        '{"query": "ترجمة: محطة القطار"}',
        "محطة القطار: المكان الذي تتوقف فيه القطارات. الجمع: محطات. مثال: أين محطة القطار؟",
        "How do you say 'train station' in Arabic?",
        "محطة القطار (mahattat al-qitar).",
    ),
    (
        "lookup",
        '{"query": "서울 지하철 요금"}',
        "서울 지하철 기본요금은 1,400원이며 10km를 넘으면 5km마다 100원이 추가됩니다.",
        "What does the Seoul subway cost?",
        "1,400 KRW for the first 10 km, then 100 KRW per 5 km.",
    ),
    (
        "get_weather",
        '{"city": "Αθήνα"}',
        weather("Αθήνα", 24.0, "ηλιοφάνεια"),
        "Και ο καιρός στην Αθήνα σήμερα;",
        "Ηλιοφάνεια και 24 °C στην Αθήνα.",
    ),
    (
        "lookup",
        '{"query": "เวลาเปิดวัดพระแก้ว"}',
        "วัดพระแก้วเปิดทุกวัน เวลา 08:30 ถึง 15:30 น. ค่าเข้าชม 500 บาท แต่งกายสุภาพ",
        "When does Wat Phra Kaew open?",
        "Every day from 08:30 to 15:30; entry is 500 baht, dress modestly.",
    ),
    (
        "lookup",
        '{"query": "रेल टिकट नियम"}',
        "तत्काल टिकट यात्रा से एक दिन पहले सुबह दस बजे से बुक होते हैं; रद्द करने पर पैसा वापस नहीं मिलता।",
        "When can I book a Tatkal train ticket in India?",
        "From 10:00 the day before travel; they are not refundable.",
    ),
)


def _turn(
    number: int,
    kinds: Sequence[str] = _KINDS,
    tools: Sequence[tuple[str, str, str, str, str]] = _TOOL_TURNS,
) -> Turn:
    """The turn ``number`` (from 1): a tool exchange every fourth, else the next script
    (of ``kinds``, the tool exchanges of ``tools``, in their order)."""
    if number % 4 == 0:
        tool, arguments, result, prompt, answer = tools[(number // 4 - 1) % len(tools)]
        return Turn(
            prompt=f"{prompt} (#{number})",
            kind="tool",
            answer=answer,
            tool=tool,
            arguments=arguments,
            result=result,
        )
    index = number - 1 - number // 4
    kind = kinds[index % len(kinds)]
    variants = _TEXT[kind]
    prompt, answer = variants[(index // len(kinds)) % len(variants)]
    return Turn(
        prompt=prompt.format(n=number, d=number % 10),
        kind=kind,
        answer=answer,
    )


TURNS: tuple[Turn, ...] = tuple(_turn(n) for n in range(1, 61))


def conversation(order: int = 0) -> tuple[Turn, ...]:
    """The 60 turns, :data:`TURNS` for ``order`` 0; for any other, the same scripts and
    tool exchanges in another order, shuffled by ``order`` (the same on every run): a
    conversation the calibration was never developed on."""
    if order == 0:
        return TURNS
    shuffle = random.Random(order).shuffle
    kinds, tools = list(_KINDS), list(_TOOL_TURNS)
    shuffle(kinds)
    shuffle(tools)
    return tuple(_turn(n, kinds, tools) for n in range(1, 61))


def lookup(query: str) -> str:
    """The scripted result of a ``lookup`` call (the tool the agent runs)."""
    for tool, arguments, result, _, _ in _TOOL_TURNS:
        if tool == "lookup" and json.loads(arguments)["query"] == query:
            return result
    return "nothing found"
