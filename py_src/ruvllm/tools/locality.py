"""Locality: whether a lesson left the answers it was not about alone.

A fixed set of unrelated prompts (data/locality_prompts.json: 40 chat questions rendered with the
model's own chat template, 8 raw texts) gets its greedy answers once, before learning (`Answers.of`).
After a lesson, one forward over each prompt and its old answer tells, position by position, whether
greedy decoding still picks every token of it (`Answers.compare`): an answer is kept when all
`tokens` are; one that moved is generated again to say whether its first five words stayed. The same
forward gives the answers' perplexity, the drift on text the model itself writes.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .perplexity import token_nll

ANSWER_TOKENS = 24  # tokens of each greedy answer compared
FIRST_WORDS = 5  # an answer that moved should still start with the same words


def locality_prompts() -> dict[str, list[str]]:
    """The built-in prompt set: {"chat": [...], "raw": [...]}."""
    data = json.loads((Path(__file__).parent.parent / "data" / "locality_prompts.json").read_text(encoding="utf-8"))
    return {"chat": list(data["chat"]), "raw": list(data["raw"])}


@dataclass(frozen=True)
class Prompt:
    text: str
    chat: bool
    ids: list[int]  # the prompt's tokens as generation takes them
    answer: list[int]  # greedy decoding's answer before learning (up to ANSWER_TOKENS; EOS included)
    words: tuple[str, ...]  # the answer's first words


@dataclass(frozen=True)
class Locality:
    kept: int  # answers whose every token greedy decoding still picks
    same_start: int  # answers whose first FIRST_WORDS words stayed (kept ones included)
    total: int
    chat_kept: int
    chat_total: int
    answers_perplexity_ratio: float  # the answers' perplexity now / before (1.0: no drift)
    moved: tuple[tuple[str, str, str], ...]  # (prompt, answer before, answer now) of each that moved

    def summary(self) -> str:
        drift = (self.answers_perplexity_ratio - 1) * 100
        return (
            f"{self.kept}/{self.total} unrelated answers unchanged over {ANSWER_TOKENS} tokens "
            f"({self.chat_kept}/{self.chat_total} chat), {self.same_start}/{self.total} with the same first "
            f"{FIRST_WORDS} words, their perplexity {drift:+.1f}%"
        )


class Answers:
    """The greedy answers of a prompt set before learning, to compare against after (`compare`)."""

    def __init__(self, model, prompts: list[Prompt], nll: float) -> None:
        self.model, self.prompts, self.nll = model, prompts, nll

    @classmethod
    def of(cls, model, prompts: dict[str, list[str]] | None = None, tokens: int = ANSWER_TOKENS) -> Answers:
        """Greedy answers of `prompts` (default: the built-in set) with the model as it is now."""
        prompts = locality_prompts() if prompts is None else prompts
        held = []
        for chat, texts in ((True, prompts.get("chat", [])), (False, prompts.get("raw", []))):
            for text in texts:
                ids = _prompt_ids(model, text, chat)
                answer = [c.token_id for c in model.generate(ids, max_tokens=tokens, temperature=0)]
                held.append(Prompt(text, chat, ids, answer, _words(model, answer)))
        return cls(model, held, _nll_and_agreement(model, held)[0])

    def compare(self) -> Locality:
        """Where the model stands now against the answers before."""
        nll, agree = _nll_and_agreement(self.model, self.prompts)
        moved, same_start = [], 0
        for prompt, kept in zip(self.prompts, agree, strict=True):
            if kept:
                same_start += 1
                continue
            now = [c.token_id for c in self.model.generate(prompt.ids, max_tokens=len(prompt.answer), temperature=0)]
            same_start += _words(self.model, now) == prompt.words
            decode = self.model.tokenizer.decode
            moved.append((prompt.text, decode(prompt.answer), decode(now)))
        chat = [kept for prompt, kept in zip(self.prompts, agree, strict=True) if prompt.chat]
        return Locality(
            kept=sum(agree),
            same_start=same_start,
            total=len(self.prompts),
            chat_kept=sum(chat),
            chat_total=len(chat),
            answers_perplexity_ratio=math.exp(nll - self.nll),
            moved=tuple(moved),
        )


def _nll_and_agreement(model, prompts: list[Prompt]) -> tuple[float, list[bool]]:
    """The mean NLL of every answer token, and for each answer whether greedy decoding picks all of them
    (Model.completion_log_prob's forward, whose argmax is wanted too)."""
    engine, total, count, agree = model.engine, 0.0, 0, []
    for prompt in prompts:
        tokens = [*prompt.ids, *prompt.answer]
        logits = engine.forward(tokens[:-1], 0, engine.new_cache())[len(prompt.ids) - 1 :]  # (A, V)
        targets = np.asarray(prompt.answer)
        total, count = total + float(token_nll(logits, targets).sum()), count + len(targets)
        agree.append(bool(np.all(logits.argmax(axis=-1) == targets)))
    return total / max(count, 1), agree


def _prompt_ids(model, text: str, chat: bool) -> list[int]:
    if chat:
        return model.tokenizer.encode_chat([{"role": "user", "content": text}])
    return model.tokenizer.encode(text)


def _words(model, answer: list[int]) -> tuple[str, ...]:
    return tuple(model.tokenizer.decode(answer).split()[:FIRST_WORDS])
