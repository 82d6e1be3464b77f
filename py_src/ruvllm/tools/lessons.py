"""The deep loop, offline: many lessons from a feedback file learned in one go, then what stayed.

A feedback file is JSON Lines, one lesson per line:

    {"prompt": "The capital of Zorbia is", "completion": " Quillon.", "reward": 1}
    {"messages": [{"role": "user", "content": "Hi"}], "completion": "Hello!", "reward": -1}

`prompt` is raw text (or, with "chat": true, one user message); `messages` a conversation rendered with
the chat template; `reward` defaults to 1. Lessons run in file order, `epochs` times over, each with
the optimizer steps and consolidation (EWC) of `Model.adapt`. The report says, per lesson, the mean
log-probability of its completion before any lesson, right after its own, and at the end, and whether
greedy decoding reproduces it at the end (retention, for rewarded lessons), plus the perplexity of an
evaluation text before and after (the drift).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidArgumentError
from ..files.jsonfields import MAX_FILE_DEPTH, nesting_depth
from ..learning.learn import AdaptOptions, check_reward
from ..tools.perplexity import perplexity


@dataclass(frozen=True)
class LessonLine:
    prompt: str | list[dict]
    completion: str
    reward: float
    chat: bool
    line: int  # in the file, from 1


def read_lessons(text: str, source: str) -> list[LessonLine]:
    """The lessons of a feedback file's text; a malformed line is refused with its number."""
    lessons = []
    for number, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        where = f"{source} line {number}"
        if nesting_depth(raw.encode("utf-8", "surrogatepass")) > MAX_FILE_DEPTH:
            raise InvalidArgumentError(f"{where}: not JSON (nested deeper than {MAX_FILE_DEPTH} levels)")
        try:
            item = json.loads(raw)
        except json.JSONDecodeError as e:
            raise InvalidArgumentError(f"{where}: not JSON ({e.msg})") from None
        if not isinstance(item, dict):
            raise InvalidArgumentError(f"{where}: a lesson is an object with prompt or messages, and completion")
        unknown = set(item) - {"prompt", "messages", "completion", "reward", "chat"}
        if unknown:
            raise InvalidArgumentError(f"{where}: unknown field {sorted(unknown)[0]!r}")
        prompt = item.get("messages", item.get("prompt"))
        messages = "messages" in item
        if ("prompt" in item) == messages:
            raise InvalidArgumentError(f"{where}: give either prompt or messages")
        if messages and not (isinstance(prompt, list) and prompt and all(isinstance(m, dict) for m in prompt)):
            raise InvalidArgumentError(f"{where}: messages must be a non-empty list of {{role, content}} objects")
        if not messages and not isinstance(prompt, str):
            raise InvalidArgumentError(f"{where}: prompt must be a string")
        completion, reward = item.get("completion"), item.get("reward", 1)
        if not isinstance(completion, str) or not completion:
            raise InvalidArgumentError(f"{where}: completion must be a non-empty string")
        reward = check_reward(reward, f"{where}: reward")
        assert isinstance(prompt, (str, list))  # (checked above, by the way it was given)
        lessons.append(LessonLine(prompt, completion, reward, bool(item.get("chat", False)), number))
    if not lessons:
        raise InvalidArgumentError(f"{source}: no lessons")
    return lessons


def run_lessons(model, lessons: list[LessonLine], adapter: str, options: AdaptOptions, epochs: int, eval_text: str):
    """Learn every lesson (`epochs` times over) on adapter `adapter` of `model` (api.Model); the report."""
    if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1:
        raise InvalidArgumentError(f"epochs must be an integer >= 1, got {epochs!r}")
    eval_ids = model.tokenizer.encode(eval_text)
    window = min(1024, model.engine.context_length)

    def ppl() -> float:
        return perplexity(model.engine, eval_ids, window).perplexity

    def log_prob(lesson: LessonLine) -> float:
        prompt_ids, completion_ids = model.feedback_ids(lesson.prompt, lesson.completion, lesson.chat)
        return model.completion_log_prob(prompt_ids, completion_ids)

    with model.engine.lock:
        model.adapters.learner(adapter)  # made (default config) if missing, and active
    before_ppl = ppl()
    first = [log_prob(lesson) for lesson in lessons]
    own = [0.0] * len(lessons)
    steps = 0
    for _ in range(epochs):
        for i, lesson in enumerate(lessons):
            report = model.adapt(lesson.prompt, lesson.completion, lesson.reward, adapter, lesson.chat, **_kw(options))
            own[i], steps = report.log_prob_after, steps + report.steps
    end = [log_prob(lesson) for lesson in lessons]
    rows, kept, rewarded = [], 0, 0
    for lesson, a, b, c in zip(lessons, first, own, end, strict=True):
        reproduced = None
        if lesson.reward > 0:
            reproduced = model.reproduces(lesson.prompt, lesson.completion, lesson.chat)
            kept, rewarded = kept + reproduced, rewarded + 1
        rows.append(
            {
                "line": lesson.line,
                "reward": lesson.reward,
                "log_prob_before": a,
                "log_prob_after_lesson": b,
                "log_prob_at_end": c,
                "reproduced": reproduced,
            }
        )
    after_ppl = ppl()
    return {
        "lessons": rows,
        "epochs": epochs,
        "steps": steps,
        "retention": {"reproduced": kept, "of": rewarded},
        "perplexity": {"before": before_ppl, "after": after_ppl, "change": after_ppl / before_ppl - 1},
        "mean_log_prob": {"before": float(np.mean(first)), "at_end": float(np.mean(end))},
    }


def _kw(options: AdaptOptions) -> dict:
    return {k: getattr(options, k) for k in AdaptOptions.__dataclass_fields__}
