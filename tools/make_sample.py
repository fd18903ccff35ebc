"""A small, deterministic SQuAD-format sample so the demo and the tests need no download.

Paragraphs are short biographies of invented people; questions ask for facts stated in them. A few
articles are long enough to need several sliding windows at 384 tokens, and the v2.0 split adds
unanswerable questions about people the paragraph does not mention. Regenerate the shipped files with
`python tools/make_sample.py` (writes bert_squad/sample/).

Each question has one answer a reader can tell from the text alone: the people of a paragraph have
different first names and different surnames (a sentence that names someone by first name, or a company
named after a surname, points at one person), and the two dates of a life differ in kind (a birth is a
day, a founding is a year), as do the questions that ask for them.
"""

import json
import random
import sys
from pathlib import Path

FIRST = [
    "Ada",
    "Boris",
    "Chen",
    "Dalia",
    "Emil",
    "Farah",
    "Goran",
    "Hana",
    "Ivo",
    "Jonas",
    "Kiri",
    "Lena",
    "Mateo",
    "Nadia",
    "Oskar",
    "Priya",
    "Quentin",
    "Rosa",
    "Sven",
    "Tomoko",
    "Ugo",
    "Vera",
    "Wen",
    "Yusuf",
]
LAST = [
    "Albrecht",
    "Borowski",
    "Castell",
    "Duarte",
    "Eriksen",
    "Fontaine",
    "Grillo",
    "Haddad",
    "Ivanova",
    "Jansen",
    "Kowalczyk",
    "Lindqvist",
    "Moreau",
    "Novak",
    "Okafor",
    "Petrov",
    "Quint",
    "Rinaldi",
]
CITIES = [
    "Lugano",
    "Tampere",
    "Graz",
    "Bergen",
    "Coimbra",
    "Brno",
    "Ghent",
    "Aarhus",
    "Trieste",
    "Split",
    "Kaunas",
    "Lyon",
    "Basel",
    "Uppsala",
    "Krakow",
    "Bologna",
    "Utrecht",
    "Malmo",
    "Porto",
    "Lille",
]
FIELDS = [
    "physics",
    "chemistry",
    "geology",
    "linguistics",
    "astronomy",
    "economics",
    "botany",
    "mathematics",
    "architecture",
    "medicine",
    "philosophy",
    "music",
]
PRODUCTS = [
    "ceramic valves",
    "river barges",
    "weather balloons",
    "glass lenses",
    "wool blankets",
    "bicycle frames",
    "printing presses",
    "solar kettles",
    "violin strings",
    "fishing nets",
]
MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
COMPANY_SUFFIX = ["Works", "Instruments", "Foundry", "Laboratories", "Brothers", "Industries"]
FILLER = [
    "The region was known for its long winters and busy harbours.",
    "Local newspapers reported on the work for many years.",
    "Several of the early letters survive in a municipal archive.",
    "Historians still disagree about the exact sequence of events.",
    "The period saw rapid growth of railways across the continent.",
]


def _person(rng, first, last):
    name = f"{first} {last}"
    born = rng.randint(1801, 1960)
    return {
        "name": name,
        "city": rng.choice(CITIES),
        "born": f"{rng.randint(1, 28)} {rng.choice(MONTHS)} {born}",
        "field": rng.choice(FIELDS),
        "company": f"{name.split()[1]} {rng.choice(COMPANY_SUFFIX)}",
        "product": rng.choice(PRODUCTS),
        "founded": str(born + rng.randint(22, 45)),
    }


def _paragraph(rng, people, filler):
    """Build the text and remember where each fact starts, so answer_start is exact by construction."""
    parts, spans, pos = [], {}, 0

    def add(text, facts=()):
        nonlocal pos
        for key, value in facts:
            spans[key] = pos + text.index(value)
        parts.append(text)
        pos += len(text) + 1

    for i, p in enumerate(people):
        add(
            f"{p['name']} was born in {p['city']} on {p['born']}.", [((i, "city"), p["city"]), ((i, "born"), p["born"])]
        )
        add(
            f"After school, {p['name'].split()[0]} studied {p['field']} at the university.",
            [((i, "field"), p["field"])],
        )
        add(
            f"In {p['founded']}, {p['name']} founded {p['company']}, which made {p['product']}.",
            [((i, "founded"), p["founded"]), ((i, "company"), p["company"]), ((i, "product"), p["product"])],
        )
        for _ in range(filler):
            add(rng.choice(FILLER))
    return " ".join(parts), spans


QUESTIONS = {
    "city": ["Where was {name} born?", "In which city was {name} born?"],
    "born": ["When was {name} born?", "On what date was {name} born?"],
    "field": ["What did {name} study?", "Which subject did {name} study at the university?"],
    "founded": ["In which year did {name} found a company?", "In which year was {company} founded?"],
    "company": ["What company did {name} found?", "Which firm was founded by {name}?"],
    "product": ["What did {company} make?", "What did the company of {name} produce?"],
}


def generate(seed, n_articles, version_2=False):
    rng = random.Random(seed)
    articles = []
    for a in range(n_articles):
        paragraphs = []
        for p in range(3):
            long = a % 7 == 0 and p == 0  # some contexts need several 384-token windows
            n = 8 if long else rng.randint(1, 3)
            # different first names and surnames: "Ada studied ..." and "Novak Works" point at one person
            people = [_person(rng, f, la) for f, la in zip(rng.sample(FIRST, n), rng.sample(LAST, n))]
            context, spans = _paragraph(rng, people, filler=3 if long else rng.randint(0, 1))
            qas = []
            for (i, key), start in sorted(spans.items()):
                if rng.random() < 0.5:
                    continue
                person = people[i]
                question = rng.choice(QUESTIONS[key]).format(**person)
                qas.append(
                    {
                        "id": f"{seed}-{a}-{p}-{i}-{key}",
                        "question": question,
                        "answers": [{"text": person[key], "answer_start": start}],
                    }
                )
                if version_2:
                    qas[-1]["is_impossible"] = False
            if version_2:
                for k in range(2):
                    # a name none of the paragraph's people has, in part or whole: the question is about no one there
                    first = rng.choice([f for f in FIRST if all(f != p["name"].split()[0] for p in people)])
                    last = rng.choice([la for la in LAST if all(la != p["name"].split()[1] for p in people)])
                    stranger = _person(rng, first, last)
                    key = rng.choice(["city", "born", "field", "company"])
                    qas.append(
                        {
                            "id": f"{seed}-{a}-{p}-x{k}",
                            "is_impossible": True,
                            "answers": [],
                            "question": rng.choice(QUESTIONS[key]).format(**stranger),
                        }
                    )
            paragraphs.append({"context": context, "qas": qas})
        articles.append({"title": f"Sample_{seed}_{a}", "paragraphs": paragraphs})
    return {"version": "v2.0" if version_2 else "1.1", "data": articles}


SPLITS = {"train-v1.1.json": (1, 32, False), "dev-v1.1.json": (2, 10, False), "dev-v2.0.json": (3, 8, True)}


def write_all(out_dir):
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, (seed, n_articles, v2) in SPLITS.items():
        (out_dir / name).write_text(json.dumps(generate(seed, n_articles, v2), indent=1) + "\n")


if __name__ == "__main__":
    write_all(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "bert_squad" / "sample")
