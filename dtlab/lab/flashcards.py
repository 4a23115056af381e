"""Flash cards for the glossary: English -> Chinese, or Chinese -> English.

For learners who hear these words in meetings in one language and read them
in the other. A deck is shuffled with a seed, so a class can share an order.
"""

from __future__ import annotations

import random

import ipywidgets as widgets

from dtlab.course.glossary import Term, all_terms
from dtlab.i18n import get_language, register, t
from dtlab.lab.view import View

register(
    {
        "cards.direction": ("direction", "方向"),
        "cards.en_to_zh": ("English → 中文", "English → 中文"),
        "cards.zh_to_en": ("中文 → English", "中文 → English"),
        "cards.show": ("Show answer", "显示答案"),
        "cards.knew": ("I knew it", "我答对了"),
        "cards.again": ("Not yet", "还不会"),
        "cards.progress": ("card {n} of {total} — known {known}", "第 {n} / {total} 张 —— 已掌握 {known} 张"),
        "cards.done": (
            "Deck finished: you knew {known} of {total}. Again?",
            "这一轮结束：{total} 张里你答对了 {known} 张。再来一轮？",
        ),
        "cards.lesson": ("runs in", "对应课程"),
    }
)


class Deck:
    """The cards and the learner's progress, independent of any widget (testable)."""

    def __init__(self, terms: tuple[Term, ...] | None = None, *, direction: str = "en_to_zh", seed: int = 0):
        self.terms = list(terms if terms is not None else all_terms())
        random.Random(seed).shuffle(self.terms)
        self.direction = direction
        self.position, self.known, self.again = 0, [], []

    @property
    def finished(self) -> bool:
        return self.position >= len(self.terms)

    def current(self) -> Term:
        return self.terms[self.position]

    def question(self) -> str:
        term = self.current()
        return term.title("en") if self.direction == "en_to_zh" else term.zh

    def answer(self) -> str:
        term = self.current()
        return term.zh if self.direction == "en_to_zh" else term.title("en")

    def mark(self, knew: bool) -> None:
        (self.known if knew else self.again).append(self.current().slug)
        self.position += 1


class FlashCards(View):
    """A card, a Show button, and I-knew-it / Not-yet buttons that step through the deck."""

    labels = {
        "direction": "cards.direction",
        "show_button": "cards.show",
        "knew_button": "cards.knew",
        "again_button": "cards.again",
    }
    clicks = {"show_button": "show", "knew_button": "knew", "again_button": "not_yet"}
    changes = {"direction": "restart"}

    def __init__(self, *, direction: str = "en_to_zh", seed: int = 0):
        self.seed = seed
        self.direction = widgets.ToggleButtons(options=[("", "en_to_zh"), ("", "zh_to_en")], value=direction)
        self.card = widgets.HTML()
        self.show_button = widgets.Button(icon="eye")
        self.knew_button = widgets.Button(button_style="success", icon="check")
        self.again_button = widgets.Button(button_style="warning", icon="repeat")
        self.progress = widgets.HTML()
        self.widget = widgets.VBox(
            [
                self.direction,
                self.card,
                widgets.HBox([self.show_button, self.knew_button, self.again_button]),
                self.progress,
            ]
        )
        self.deck = Deck(direction=direction, seed=seed)
        self.revealed = False
        self.start()

    def restart(self) -> None:
        self.deck = Deck(direction=self.direction.value, seed=self.seed)
        self.revealed = False
        self._draw(get_language())

    def refresh(self, lang: str) -> None:
        self.direction.options = [(t("cards.en_to_zh", lang), "en_to_zh"), (t("cards.zh_to_en", lang), "zh_to_en")]
        self._draw(lang)

    def show(self) -> None:
        self.revealed = True
        self._draw(get_language())

    def knew(self) -> None:
        self.mark(True)

    def not_yet(self) -> None:
        self.mark(False)

    def mark(self, knew: bool) -> None:
        if not self.deck.finished:
            self.deck.mark(knew)
            self.revealed = False
        self._draw(get_language())

    def _draw(self, lang: str) -> None:
        deck = self.deck
        if deck.finished:
            self.card.value = f"<h3>{t('cards.done', lang, known=len(deck.known), total=len(deck.terms))}</h3>"
            self.progress.value = ""
            return
        html = f"<h2>{deck.question()}</h2>"
        if self.revealed:
            term = deck.current()
            lessons = ", ".join(p.split("/")[-1] for p in term.lessons)
            html += (
                f"<h3>{deck.answer()}</h3><p>{term.definition.in_lang(lang)}</p>"
                f"<p><i>{term.example.in_lang(lang)}</i></p><p>{t('cards.lesson', lang)}: {lessons}</p>"
            )
        self.card.value = html
        self.progress.value = t(
            "cards.progress", lang, n=deck.position + 1, total=len(deck.terms), known=len(deck.known)
        )
