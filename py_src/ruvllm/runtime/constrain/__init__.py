"""Constrained decoding: only tokens that keep the output a prefix of a valid JSON document (OpenAI's
`response_format`: `json_object`, or `json_schema` with a JSON Schema).

    vocabulary = Vocabulary(tokenizer.token_bytes, config.vocab_size, tokenizer.special_ids, eos_ids)  # once
    matcher = Matcher(json_grammar(schema), vocabulary)                                                # per request
    logits[~matcher.allowed()] = -np.inf; token = sample(logits); matcher.advance(token)

Pure Python and NumPy, so it runs in Pyodide too. The parser reads bytes, not characters: a token may
end inside a UTF-8 character, and string content accepts any bytes that can still complete to valid
UTF-8 (no surrogates, no overlong forms); the whole output always decodes as UTF-8.

Supported JSON Schema: `type` (object, array, string, integer, number, boolean, null, or a list of
them), `properties` (written in schema order; required ones always, optional ones may be skipped),
`required`, `additionalProperties` (with `properties`: only listed properties are written; with no
properties listed: free keys whose values follow `additionalProperties`, any value if it is true or if
the schema says nothing about properties at all, but `"properties": {}` alone is the empty object), `items`,
`minItems`, `maxItems`, `enum`, `const` (any JSON values, written compactly, non-ASCII either raw or
\\u-escaped), `anyOf`, `$ref` to `#`, `#/$defs/...` or `#/definitions/...` (recursion allowed),
`minLength`/`maxLength` (characters), and for integers `minimum`, `maximum`, `exclusiveMinimum`,
`exclusiveMaximum` (enforced exactly: a digit is allowed only if some completion is in range).
Annotations are ignored: title, description, default, examples, $schema, $id, $comment, deprecated,
readOnly, writeOnly, and `format`, which is an annotation as in jsonschema's default validator. Any
other keyword (pattern, oneOf, allOf, not, bounds on non-integer numbers, ...) is refused with an
`InvalidArgumentError` naming the keyword and where it is. Without `type`, the types are those the
keywords present describe (`properties` -> object, ...), or any JSON value.

What is written, so that generation always ends:
- whitespace between structural tokens as in llama.cpp's json-schema grammar: nothing, one space, or
  one or two newlines followed by at most 20 spaces or tabs; none before or after the whole value;
- integers of at most 16 digits, fractions of at most 16 digits, exponents of at most 3 digits;
- \\u escapes of UTF-16 surrogates (D800-DFFF) are refused (write the character in UTF-8 instead).
Once the output is a complete document (and suffix) only EOS is allowed; a top-level number without a
suffix is therefore complete as soon as it is a valid number.

How masks stay cheap (SmolLM2, 49152 tokens: median 0.005-0.03 ms a token, p95 under 0.5 ms, see
benchmarks/constrain_bench.py; the model's own step is ~25-45 ms):
- The parser state is a set of configurations; a configuration is a tuple of frames (a stack), and a
  frame is a small tuple, so states are hashable. States are interned and each keeps its byte
  transitions and its mask: a lazy DFA, memoized per grammar and vocabulary. Inside a free string the
  state repeats, so its mask is computed once.
- The mask of a state walks a byte trie of the vocabulary depth-first together with the DFA, pruning a
  branch at its first impossible byte; each state carries a cheap superset of the bytes it can read,
  so impossible bytes are skipped without stepping the parser.
- Inside a string most tokens are plain text (no `"`, `\\`, control byte; whole UTF-8 characters):
  they are all allowed at once from a precomputed array of their character counts; only the few other
  tokens (SmolLM2: 671) are walked, in tries of what follows their plain-text head.
- The trie is flat lists, not 100k dicts, and the automaton has no reference cycles (it is freed with
  its grammar by reference counting), so they add little to garbage collection. (A full collection in
  a process holding a tokenizer still costs 10-20 ms now and then; `gc.freeze()` after loading
  removes that from generation.)


Files, in the order they build on each other:
- `vocabulary.py`: Vocabulary (the tokens as bytes, their tries and token classes), once per tokenizer.
- `nodes.py`: the nodes a schema compiles to.
- `parser.py`: configurations of frames read one byte at a time; the MAX_* limits of what is written.
- `automaton.py`: the lazy DFA of a grammar for one vocabulary, with each state's mask.
- `grammar.py`: Grammar, a compiled grammar that caches its automata.
- `schema.py`: json_grammar, JSON Schema to Grammar, and what it refuses.
- `matcher.py`: Matcher, which follows one generation.

Dimension letters: V vocabulary size (the width of the logits).
"""

from .automaton import MAX_DFA_STATES
from .grammar import Grammar
from .matcher import Matcher
from .parser import MAX_EXPONENT_DIGITS, MAX_FRACTION_DIGITS, MAX_INDENT, MAX_INT_DIGITS, MAX_NEWLINES
from .schema import json_grammar
from .vocabulary import Vocabulary

__all__ = [
    "MAX_DFA_STATES",
    "MAX_EXPONENT_DIGITS",
    "MAX_FRACTION_DIGITS",
    "MAX_INDENT",
    "MAX_INT_DIGITS",
    "MAX_NEWLINES",
    "Grammar",
    "Matcher",
    "Vocabulary",
    "json_grammar",
]
