"""What the commands do with a model besides generating: measure it, teach it, merge into it.

- `perplexity.py`: perplexity of a text.
- `bench.py`: one benchmark run (prefill, time to first token, decode speed, memory).
- `lessons.py`: many lessons from a feedback file learned in one go, then what stayed.
- `locality.py`: whether a lesson left unrelated answers alone (greedy answers before and after).
- `merge.py`: `ruvllm merge`, an adapter added into a model's weights, written as a new folder.
"""
