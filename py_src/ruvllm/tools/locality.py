"""Locality: whether a lesson left the answers it was not about alone.

A fixed set of unrelated prompts (data/locality_prompts.json: 40 chat questions rendered with the
model's own chat template, 8 raw texts) gets its greedy answers once, before learning (`Answers.of`).
After a lesson, one forward over each prompt and its old answer tells, position by position, whether
greedy decoding still picks every token of it (`Answers.compare`): an answer is kept when all
`tokens` are; one that moved is generated again to say whether its first five words stayed. The same
forward gives the answers' perplexity, the drift on text the model itself writes.

Some answers hold near-ties: a position where the base model's choice leads the next token by a few
hundredths of a logit. Any change flips them, one that moves no measurable perplexity too (measured on
SmolLM2: a random adapter at 1e-2 flipped 5 of the 40 chat answers, each at a lead below 0.025). So
`compare` also counts the answers kept but for such ties (`kept_but_ties`: every position that changed
had led by less than TIE_MARGIN before).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from .perplexity import token_nll

ANSWER_TOKENS = 24  # tokens of each greedy answer compared
FIRST_WORDS = 5  # an answer that moved should still start with the same words
TIE_MARGIN = 0.05  # a position whose choice led by less than this (logits) before is a near-tie


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
    leads: tuple[float, ...] = ()  # at each answer position, the chosen token's logit over the next one's


@dataclass(frozen=True)
class Locality:
    kept: int  # answers whose every token greedy decoding still picks
    same_start: int  # answers whose first FIRST_WORDS words stayed (kept ones included)
    total: int
    chat_kept: int
    chat_total: int
    kept_but_ties: int  # answers whose every changed position was a near-tie (TIE_MARGIN); kept ones included
    chat_kept_but_ties: int
    answers_perplexity_ratio: float  # the answers' perplexity now / before (1.0: no drift)
    moved: tuple[tuple[str, str, str], ...]  # (prompt, answer before, answer now) of each that moved

    def summary(self) -> str:
        drift = (self.answers_perplexity_ratio - 1) * 100
        return (
            f"{self.kept}/{self.total} unrelated answers unchanged over {ANSWER_TOKENS} tokens "
            f"({self.chat_kept}/{self.chat_total} chat; but for near-ties {self.kept_but_ties}, "
            f"{self.chat_kept_but_ties} chat), {self.same_start}/{self.total} with the same first "
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
        nll, scores = _score(model, held)
        held = [replace(prompt, leads=tuple(score.leads)) for prompt, score in zip(held, scores, strict=True)]
        return cls(model, held, nll)

    def compare(self) -> Locality:
        """Where the model stands now against the answers before."""
        nll, scores = _score(self.model, self.prompts)
        agree = [not len(score.changed) for score in scores]
        pairs = zip(self.prompts, scores, strict=True)
        ties = [all(prompt.leads[i] < TIE_MARGIN for i in score.changed) for prompt, score in pairs]
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
            kept_but_ties=sum(ties),
            chat_kept_but_ties=sum(tie for prompt, tie in zip(self.prompts, ties, strict=True) if prompt.chat),
            answers_perplexity_ratio=math.exp(nll - self.nll),
            moved=tuple(moved),
        )


@dataclass(frozen=True)
class _Score:
    changed: np.ndarray  # the answer positions where greedy decoding picks another token now
    leads: np.ndarray  # (A,) at each position, the answer token's logit over the best other token's


def _score(model, prompts: list[Prompt]) -> tuple[float, list[_Score]]:
    """The mean NLL of every answer token, and each answer's _Score (Model.completion_log_prob's forward,
    whose argmax is wanted too)."""
    engine, total, count, scores = model.engine, 0.0, 0, []
    for prompt in prompts:
        tokens = [*prompt.ids, *prompt.answer]
        logits = engine.forward(tokens[:-1], 0, engine.new_cache())[len(prompt.ids) - 1 :]  # (A, V)
        targets = np.asarray(prompt.answer)
        total, count = total + float(token_nll(logits, targets).sum()), count + len(targets)
        at = np.arange(len(targets))
        chosen = logits[at, targets]
        others = logits.copy()
        others[at, targets] = -np.inf
        changed = np.flatnonzero(logits.argmax(axis=-1) != targets)
        scores.append(_Score(changed, (chosen - others.max(axis=-1)).astype(np.float64)))
    return total / max(count, 1), scores


def _prompt_ids(model, text: str, chat: bool) -> list[int]:
    if chat:
        return model.tokenizer.encode_chat([{"role": "user", "content": text}])
    return model.tokenizer.encode(text)


def _words(model, answer: list[int]) -> tuple[str, ...]:
    return tuple(model.tokenizer.decode(answer).split()[:FIRST_WORDS])
