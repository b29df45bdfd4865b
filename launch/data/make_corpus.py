"""Write ``corpus.txt``: deterministic English-like prose for the byte-level GPT workload.

Nothing may be downloaded at run time, so the training text is generated from a small hand-written
grammar (stories, letters, dialogue, notes, lists, dates and numbers) with a fixed seed. The output is
the same for every run of this script, so ``corpus.txt`` is shipped and regenerating it is a no-op:

    python launch/data/make_corpus.py            # rewrites launch/data/corpus.txt (~300 KB)

The text has the statistics a tiny language model can learn quickly (frequent words, spelling,
punctuation, capitalisation, agreement inside templates) while staying varied enough that the
held-out tail is not memorised verbatim.
"""
from __future__ import annotations

import random
import sys
from pathlib import Path

SEED = 20240611
TARGET_BYTES = 300_000

PEOPLE = ["Anna", "Tomas", "Mira", "Jonah", "Elsa", "Farid", "Greta", "Hugo", "Ines", "Kofi", "Lena",
          "Marek", "Nadia", "Oskar", "Priya", "Rosa", "Samir", "Tilde", "Viktor", "Yara"]
NAMES = PEOPLE + ["the miller", "the old captain", "the baker", "the teacher", "the ferryman", "the doctor",
                  "my aunt"]
PLACES = ["the harbour", "the market", "the old mill", "the station", "the library", "the orchard",
          "the bridge", "the village square", "the lighthouse", "the forest road", "the river bank",
          "the school", "the kitchen", "the workshop", "the hill above the town", "the chapel"]
THINGS = ["a letter", "the lantern", "a basket of apples", "the map", "a small wooden box", "the key",
          "a loaf of bread", "the old clock", "a blue coat", "the ledger", "a pair of boots", "the kettle",
          "a bundle of rope", "the compass", "a jar of honey", "the violin", "a broken wheel", "the notebook"]
ADJECTIVES = ["quiet", "cold", "bright", "narrow", "crowded", "empty", "grey", "warm", "long", "strange",
              "familiar", "heavy", "careful", "tired", "cheerful", "patient", "sudden", "gentle", "dark"]
ADVERBS = ["slowly", "quickly", "carefully", "quietly", "at once", "without a word", "again", "twice",
           "before dawn", "after supper", "in a hurry", "with some care", "late that night"]
VERBS_PAST = [("carried", "thing"), ("found", "thing"), ("lost", "thing"), ("mended", "thing"),
              ("opened", "thing"), ("sold", "thing"), ("hid", "thing"), ("visited", "place"),
              ("left", "place"), ("crossed", "place"), ("cleaned", "place"), ("watched", "place"),
              ("walked to", "place"), ("waited at", "place"), ("met", "name"), ("thanked", "name"),
              ("called", "name"), ("followed", "name"), ("helped", "name"), ("wrote to", "name")]
WEATHER = ["The rain had not stopped since morning.", "A thin fog lay over the water.",
           "The wind came from the north and smelled of salt.", "It was the first warm day of spring.",
           "Snow had fallen in the night and the roads were white.", "The sky cleared before noon.",
           "Thunder rolled somewhere beyond the hills.", "The air was still and the leaves did not move."]
FEELINGS = ["glad", "worried", "surprised", "curious", "ashamed", "relieved", "angry", "hopeful", "sure"]
CONNECTORS = ["and", "but", "so", "because", "although", "while", "until", "after", "before"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
QUESTIONS = ["Where did you put {thing}?", "Have you seen {name} today?", "Is it far to {place}?",
             "Why are you so {feeling}?", "What time does the ferry leave?", "Can you help me with {thing}?",
             "Who left {thing} at {place}?", "Shall we go to {place} tomorrow?"]
ANSWERS = ["I left it at {place}.", "No, not since {day}.", "It is about {num} miles from here.",
           "Because {name} {verb} {obj}.", "At half past {num}, if the weather holds.", "Of course, bring it here.",
           "I think it was {name}.", "Only if the rain stops."]
SAYING = ["said", "asked", "answered", "whispered", "called out", "replied", "muttered"]
NOTES = ["Remember to buy {thing} and {thing2}.", "Meet {name} at {place} on {day}.",
         "The {adj} door at {place} needs a new lock.", "Pay {num} coins to {name} before {month}.",
         "Do not forget {thing}: it is under the stairs."]


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def cap(text: str) -> str:
    return text[:1].upper() + text[1:]


class Writer:
    def __init__(self, rng: random.Random):
        self.r = rng

    def pick(self, items):
        return self.r.choice(items)

    def obj(self, kind: str) -> str:
        return self.pick({"thing": THINGS, "place": PLACES, "name": NAMES}[kind])

    def clause(self) -> str:
        verb, kind = self.pick(VERBS_PAST)
        subject = self.pick(NAMES)
        text = f"{subject} {verb} {self.obj(kind)}"
        roll = self.r.random()
        if roll < 0.3:
            text += " " + self.pick(ADVERBS)
        elif roll < 0.5:
            text += f" near {self.pick(PLACES)}"
        elif roll < 0.6:
            text += f" on a {self.pick(ADJECTIVES)} {self.pick(DAYS)}"
        return text

    def sentence(self) -> str:
        roll = self.r.random()
        if roll < 0.35:
            text = self.clause()
        elif roll < 0.6:
            text = f"{self.clause()} {self.pick(CONNECTORS)} {self.clause()}"
        elif roll < 0.72:
            text = f"{self.pick(NAMES)} was {self.pick(FEELINGS)} that {self.clause()}"
        elif roll < 0.82:
            text = f"{self.pick(PLACES)} was {self.pick(ADJECTIVES)} and {self.pick(ADJECTIVES)}"
        elif roll < 0.9:
            return self.pick(WEATHER)
        else:
            text = (f"On the {ordinal(self.r.randint(1, 28))} of {self.pick(MONTHS)}, {self.clause()}, "
                    f"and {self.r.randint(2, 40)} people came to see it")
        return cap(text) + self.pick([".", ".", ".", ".", "!"])

    def fill(self, template: str) -> str:
        verb, kind = self.pick(VERBS_PAST)
        return template.format(thing=self.pick(THINGS), thing2=self.pick(THINGS), name=cap(self.pick(NAMES)),
                               place=self.pick(PLACES), feeling=self.pick(FEELINGS), day=self.pick(DAYS),
                               num=self.r.randint(2, 12), verb=verb, obj=self.obj(kind), adj=self.pick(ADJECTIVES),
                               month=self.pick(MONTHS))

    def paragraph(self) -> str:
        return " ".join(self.sentence() for _ in range(self.r.randint(3, 7)))

    def dialogue(self) -> str:
        a, b = self.r.sample(PEOPLE, 2)
        lines = []
        for _ in range(self.r.randint(2, 4)):
            lines.append(f'"{self.fill(self.pick(QUESTIONS))}" {self.pick(SAYING)} {a}.')
            lines.append(f'"{self.fill(self.pick(ANSWERS))}" {self.pick(SAYING)} {b}.')
            a, b = b, a
        return "\n".join(lines)

    def letter(self) -> str:
        to, sender = self.r.sample(PEOPLE, 2)
        date = f"{self.pick(DAYS)}, {self.r.randint(1, 28)} {self.pick(MONTHS)} {self.r.randint(1890, 1935)}"
        body = self.paragraph()
        return f"{date}\n\nDear {to},\n\n{body}\n\nYours truly,\n{sender}"

    def notes(self) -> str:
        items = [f"{i}. {self.fill(self.pick(NOTES))}" for i in range(1, self.r.randint(3, 6) + 1)]
        return "Notes for the week:\n" + "\n".join(items)

    def ledger(self) -> str:
        rows = [f"{cap(self.pick(THINGS)):<24}"
                f"{self.r.randint(1, 99):>4} x {self.r.randint(1, 50):>3}.{self.r.randint(0, 99):02d}"
                for _ in range(self.r.randint(3, 6))]
        return "Accounts, " + self.pick(MONTHS) + ":\n" + "\n".join(rows)

    def chapter(self, number: int) -> str:
        title = f"{cap(self.pick(ADJECTIVES))} {cap(self.pick(THINGS).split(' ', 1)[1])}"
        parts = [f"CHAPTER {number}. {title.upper()}"]
        for _ in range(self.r.randint(4, 9)):
            kind = self.r.random()
            if kind < 0.55:
                parts.append(self.paragraph())
            elif kind < 0.75:
                parts.append(self.dialogue())
            elif kind < 0.85:
                parts.append(self.letter())
            elif kind < 0.93:
                parts.append(self.notes())
            else:
                parts.append(self.ledger())
        return "\n\n".join(parts)


def generate(target_bytes: int = TARGET_BYTES, seed: int = SEED) -> str:
    writer = Writer(random.Random(seed))
    chapters, size = [], 0
    while size < target_bytes:
        chapters.append(writer.chapter(len(chapters) + 1))
        size += len(chapters[-1]) + 3
    return "\n\n\n".join(chapters) + "\n"


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("corpus.txt")
    out.write_text(generate(), encoding="utf-8")
    print(f"wrote {out} ({out.stat().st_size} bytes)")
