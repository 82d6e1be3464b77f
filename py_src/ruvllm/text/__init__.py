"""Text: from strings to token ids and back.

- `tokenizer.py`: the model's tokenizer.json (HF tokenizers), its special tokens and chat template.
- `pure_tokenizer.py`, `pretokenize.py`, `bpe.py`: the same ids in plain Python where `tokenizers` is missing.
- `chat_template.py`: the model's Jinja template, sandboxed and bounded.
- `detokenizer.py`: streaming detokenization, O(1) per token.
- `stream.py`: the text layer of generation (stop strings, chunks, stats).
- `tool_calls.py`: OpenAI tools: checked, shown to the template, and calls parsed out of the text.
"""
