"""Write the ``facts`` task: short questions with one-word answers, for small instruct models; and
``facts-completion``, the same questions for base models (no chat template): a two-shot ``Q: …\nA:`` completion
prompt, answered on the same line.

Each row of ``enginesmith/assets/tasks/facts-eval.jsonl`` is ``{"prompt", "answer", "aliases", "family"}``; a reply
is right when its first line contains the answer or an alias as a whole word (``enginesmith.core.tasks``). The families
are generated from the tables below, so the set is reproducible and reviewable.

``--measure MODEL_DIR`` scores a checkpoint on every family in BF16 with transformers (the model's chat template,
greedy) and prints a table; the families kept in the committed set are those a 135M instruct model does well on
(SmolLM2-135M-Instruct's scores are in the docstring of ``FAMILIES_KEPT``).

Usage: python scripts/make_facts_task.py [--form chat|completion] [--measure DIR] [--families all|kept] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
TASKS_DIR = REPO_ROOT / "enginesmith" / "assets" / "tasks"
TASK_NAMES = {"chat": "facts", "completion": "facts-completion"}
SUFFIX = " Answer with one word."
# The completion form's two shots: one-word answers to questions outside the families, so a base model answers on
# the line after "A:" in one word (with a number as a shot, Gemma 3 270M answered capitals with numbers).
SHOTS = "Q: What color is snow?\nA: White\n\nQ: What is the largest planet in the solar system?\nA: Jupiter\n\n"

CAPITALS = {
    "France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid", "Japan": "Tokyo",
    "Russia": "Moscow", "China": "Beijing", "England": "London", "Egypt": "Cairo", "Greece": "Athens",
    "Portugal": "Lisbon", "Austria": "Vienna", "Ireland": "Dublin", "Norway": "Oslo", "Sweden": "Stockholm",
    "Finland": "Helsinki", "Denmark": "Copenhagen", "Poland": "Warsaw", "Hungary": "Budapest", "Cuba": "Havana",
    "Peru": "Lima", "Chile": "Santiago", "Argentina": "Buenos", "Thailand": "Bangkok", "Kenya": "Nairobi",
    "Belgium": "Brussels", "Netherlands": "Amsterdam", "Turkey": "Ankara", "Iran": "Tehran", "Iraq": "Baghdad",
    "Canada": "Ottawa", "Australia": "Canberra", "Brazil": "Brasilia",
    "Switzerland": "Bern", "Ukraine": "Kyiv", "Vietnam": "Hanoi", "Indonesia": "Jakarta", "Colombia": "Bogota",
    "Scotland": "Edinburgh", "Wales": "Cardiff", "Iceland": "Reykjavik", "Romania": "Bucharest",
    "Bulgaria": "Sofia", "Serbia": "Belgrade", "Croatia": "Zagreb", "Czechia": "Prague", "Slovakia": "Bratislava",
    "Lebanon": "Beirut", "Syria": "Damascus", "Jordan": "Amman", "Israel": "Jerusalem", "Afghanistan": "Kabul",
    "Pakistan": "Islamabad", "Bangladesh": "Dhaka", "Nepal": "Kathmandu", "Philippines": "Manila",
    "Malaysia": "Kuala", "Singapore": "Singapore", "Nigeria": "Abuja", "Ghana": "Accra", "Ethiopia": "Addis",
    "Morocco": "Rabat", "Tunisia": "Tunis", "Algeria": "Algiers", "Venezuela": "Caracas", "Ecuador": "Quito",
    "Uruguay": "Montevideo", "Paraguay": "Asuncion", "Bolivia": "Sucre", "Jamaica": "Kingston",
    "Estonia": "Tallinn", "Latvia": "Riga", "Lithuania": "Vilnius", "Luxembourg": "Luxembourg",
}
LANGUAGES = {
    "France": "French", "Germany": "German", "Italy": "Italian", "Spain": "Spanish", "Japan": "Japanese",
    "Russia": "Russian", "China": "Chinese", "Greece": "Greek", "Portugal": "Portuguese", "Poland": "Polish",
    "Sweden": "Swedish", "Norway": "Norwegian", "Finland": "Finnish", "Denmark": "Danish", "Turkey": "Turkish",
    "Korea": "Korean", "Brazil": "Portuguese", "Mexico": "Spanish", "England": "English", "Hungary": "Hungarian",
    "the Netherlands": "Dutch", "Thailand": "Thai", "Vietnam": "Vietnamese", "Iran": "Persian", "Ukraine": "Ukrainian",
}
OPPOSITES = {
    "hot": "cold", "big": "small", "up": "down", "day": "night", "fast": "slow", "happy": "sad", "open": "closed",
    "light": "dark", "old": "new", "left": "right", "high": "low", "full": "empty", "wet": "dry", "hard": "soft",
    "good": "bad", "rich": "poor", "early": "late", "strong": "weak", "loud": "quiet", "thick": "thin",
    "win": "lose", "love": "hate", "push": "pull", "black": "white", "true": "false", "clean": "dirty",
    "heavy": "light", "long": "short", "young": "old", "inside": "outside", "buy": "sell", "begin": "end",
    "north": "south", "east": "west", "yes": "no", "first": "last", "alive": "dead", "cheap": "expensive",
    "friend": "enemy", "question": "answer", "wide": "narrow", "near": "far", "deep": "shallow", "sweet": "sour",
    "brave": "cowardly", "smooth": "rough", "tall": "short", "sharp": "blunt", "asleep": "awake",
    "always": "never", "arrive": "depart", "accept": "reject", "add": "subtract", "above": "below",
    "before": "after", "summer": "winter", "front": "back", "over": "under", "top": "bottom", "enter": "exit",
    "remember": "forget", "increase": "decrease", "victory": "defeat", "ancient": "modern", "public": "private",
    "visible": "invisible", "possible": "impossible", "polite": "rude", "guilty": "innocent", "wild": "tame",
}
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]
PLURALS = {
    "cat": "cats", "dog": "dogs", "child": "children", "mouse": "mice", "man": "men", "woman": "women",
    "foot": "feet", "tooth": "teeth", "box": "boxes", "book": "books", "car": "cars", "tree": "trees",
    "house": "houses", "baby": "babies", "city": "cities", "knife": "knives", "leaf": "leaves", "goose": "geese",
    "person": "people", "bus": "buses", "apple": "apples", "bird": "birds", "glass": "glasses", "day": "days",
    "ox": "oxen", "wolf": "wolves", "wife": "wives", "life": "lives", "half": "halves", "potato": "potatoes",
    "hero": "heroes", "story": "stories", "lady": "ladies", "church": "churches", "watch": "watches",
    "dish": "dishes", "fox": "foxes", "toy": "toys", "key": "keys", "horse": "horses", "chair": "chairs",
    "table": "tables", "pen": "pens", "cup": "cups", "flower": "flowers", "river": "rivers",
}
COLOURS = {
    "a banana": "yellow", "grass": "green", "the sky on a clear day": "blue", "snow": "white", "coal": "black",
    "a ripe tomato": "red", "an orange": "orange", "milk": "white", "a lemon": "yellow", "blood": "red",
    "a frog": "green", "chocolate": "brown", "the sun": "yellow", "a strawberry": "red", "an emerald": "green",
    "a polar bear": "white", "a crow": "black", "the ocean": "blue",
}
NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
                "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty"]
ANIMALS = {
    "a cow": "moo", "a dog": "woof", "a cat": "meow", "a duck": "quack", "a sheep": "baa", "a lion": "roar",
    "a snake": "hiss", "an owl": "hoot", "a pig": "oink", "a bee": "buzz",
}


def families() -> dict[str, list[tuple[str, str]]]:
    """Every family's (question, answer) pairs."""
    sums = [(a, b) for a in range(1, 10) for b in range(1, 10) if a <= b]
    return {
        "capital": [(f"What is the capital of {country}?", city) for country, city in CAPITALS.items()],
        "country-of-capital": [(f"{city} is the capital of which country?", country)
                               for country, city in CAPITALS.items() if len(city) > 4 and city != country],
        "language": [(f"What language do most people speak in {country}?", language)
                     for country, language in LANGUAGES.items()],
        "opposite": [(f"What is the opposite of \"{word}\"?", other) for word, other in OPPOSITES.items()],
        "next-day": [(f"What day of the week comes after {day}?", DAYS[(i + 1) % 7]) for i, day in enumerate(DAYS)],
        "next-month": [(f"What month comes after {month}?", MONTHS[(i + 1) % 12]) for i, month in enumerate(MONTHS)],
        "plural": [(f"What is the plural of \"{word}\"?", plural) for word, plural in PLURALS.items()],
        "colour": [(f"What color is {thing}?", colour) for thing, colour in COLOURS.items()],
        "number-word": [(f"How do you write the number {n} in English words?", word)
                        for n, word in enumerate(NUMBER_WORDS)],
        "sum": [(f"What is {a} plus {b}?", str(a + b)) for a, b in sums],
        "animal-sound": [(f"What sound does {animal} make?", sound) for animal, sound in ANIMALS.items()],
    }


# Families kept in the committed set: the ones SmolLM2-135M-Instruct (Q4_1 dequantised to BF16, transformers,
# greedy) answers well. Measured 2026-11-30 with --families all --measure:
#   capital 50/74, country-of-capital 46/66, language 17/25, opposite 53/70, plural 28/46 (kept: 194/281 = 69 %);
#   next-day 2/7, next-month 3/12, colour 2/18, number-word 1/21, sum 17/45, animal-sound 0/10 (dropped: it
#   answers these with a sentence that avoids the word, or wrongly).
FAMILIES_KEPT: list[str] = ["capital", "country-of-capital", "language", "opposite", "plural"]


def aliases(family: str, answer: str) -> list[str]:
    """Other spellings of the same answer: a sum's number word, Brasilia's accent."""
    if family == "sum":
        return [NUMBER_WORDS[int(answer)]]
    return {"Brasilia": ["Brasília"], "Kyiv": ["Kiev"], "Bogota": ["Bogotá"], "Reykjavik": ["Reykjavík"],
            "Asuncion": ["Asunción"], "Czechia": ["Czech"], "England": ["UK", "Britain"],
            "Persian": ["Farsi"], "Chinese": ["Mandarin"]}.get(answer, [])


def rows(selected: list[str], form: str = "chat") -> list[dict[str, object]]:
    found = families()

    def prompt(question: str) -> str:
        return question + SUFFIX if form == "chat" else f"{SHOTS}Q: {question}\nA:"

    return [{"prompt": prompt(question), "answer": answer, "aliases": aliases(family, answer), "family": family}
            for family in selected for question, answer in found[family]]


def measure(model_dir: Path, items: list[dict[str, Any]], form: str = "chat") -> dict[str, tuple[int, int]]:
    """(right, total) per family: greedy, BF16, the model's chat template (or the completion prompt as it is), scored
    like enginesmith.core.tasks."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    sys.path.insert(0, str(REPO_ROOT))
    from enginesmith.core.tasks import answer_matches, task_spec

    spec = task_spec(TASK_NAMES[form])
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
    scores: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for start in range(0, len(items), 32):
        chunk = items[start:start + 32]
        if form == "chat":
            texts = [tokenizer.apply_chat_template([{"role": "user", "content": r["prompt"]}], tokenize=False,
                                                   add_generation_prompt=True) for r in chunk]
        else:
            texts = [r["prompt"] for r in chunk]
        batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=form != "chat")
        with torch.no_grad():
            out = model.generate(**batch, max_new_tokens=spec.max_tokens, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id)
        replies = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
        for reply, row in zip(replies, chunk, strict=True):
            right = answer_matches(reply.split("\n", 1)[0], row["answer"], spec, aliases=row["aliases"])
            scores[row["family"]][0] += right
            scores[row["family"]][1] += 1
    return {family: (right, total) for family, (right, total) in scores.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--form", choices=list(TASK_NAMES), default="chat",
                        help="chat: the facts task; completion: facts-completion, for base models")
    parser.add_argument("--measure", type=Path, help="score this checkpoint per family (BF16, transformers)")
    parser.add_argument("--families", choices=["all", "kept"], default="kept")
    parser.add_argument("--out", type=Path, help="default: the shipped task file of --form")
    args = parser.parse_args()
    out = args.out or TASKS_DIR / f"{TASK_NAMES[args.form]}-eval.jsonl"
    selected = list(families()) if args.families == "all" else FAMILIES_KEPT
    items = rows(selected, args.form)
    if args.measure:
        scores = measure(args.measure, items, args.form)
        right = sum(r for r, _ in scores.values())
        for family, (r, t) in scores.items():
            print(f"{family:14s} {r:4d}/{t:<4d} {r / t:6.1%}")
        print(f"{'all':14s} {right:4d}/{len(items):<4d} {right / len(items):6.1%}")
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(row) + "\n" for row in items))
    print(f"wrote {len(items)} items ({', '.join(selected)}) to {out}")


if __name__ == "__main__":
    main()
