"""Constrained decoding: only tokens that keep the output a prefix of a valid JSON document (OpenAI's
`response_format`: `json_object`, or `json_schema` with a JSON Schema).

    vocabulary = Vocabulary(tokenizer.token_bytes, config.vocab_size, tokenizer.special_ids, eos_ids)  # once
    matcher = Matcher(json_grammar(schema), vocabulary)                                                # per request
    logits[~matcher.allowed()] = -np.inf; token = sample(logits); matcher.advance(token)

Pure Python and NumPy, so it runs in Pyodide too. The parser reads bytes, not characters: a token may
end inside a UTF-8 character, and string content accepts any bytes that can still complete to valid
UTF-8 (no surrogates, no overlong forms); the whole output always decodes as UTF-8.

Supported JSON Schema (drafts 4 to 2020-12): `type` (object, array, string, integer, number, boolean,
null, or a list of them; without it every type, each constrained by the keywords of its own type),
`properties` (in any order, each at most once, required ones always; `json_grammar(...,
property_order="schema")` keeps schema order, as XGrammar and LLGuidance do, and so do objects with
more than MAX_ANY_ORDER (16) declared properties: the set written is part of the parser state),
`required`, `dependentRequired` (and draft-04 `dependencies` lists), `minProperties` and
`maxProperties` (these two and dependentRequired for objects in any order only; undeclared keys count
once towards minProperties: they are not compared with each other),
`additionalProperties` (with `properties`: undeclared keys, with
values that follow it, may come between the declared ones unless it is false, or `json_grammar(...,
extra_properties=False)` writes only the declared ones, and `extra_properties="explicit"` (what
`response_format` uses) only where `additionalProperties` is written out; with no properties listed: free keys whose
values follow `additionalProperties`, any value if it is true or if the schema says nothing about
properties at all, but `"properties": {}` alone is the empty object), `items`, `prefixItems` (and
draft-04 `items` lists with `additionalItems`), `minItems`, `maxItems`, `enum`, `const` (JSON values
compared as JSON: 1 and 1.0 are equal, true is not 1), `anyOf`, `allOf` (merged keyword by keyword into
one schema; what cannot be merged exactly is refused), `oneOf` (when its options exclude each other by
type, literal value, integer range or the literal value of a required property, else refused: a document
valid under two options would be invalid), `$ref` resolved as the specification says: against `$id`
(draft-04 `id`) bases, to `$anchor`s and to JSON pointers (`~0`, `~1` and %-escapes decoded) anywhere in
the document (nothing is fetched), with sibling keywords merged; `minLength`/`maxLength` (characters);
`minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum` for integers and numbers (draft-04 boolean
exclusive flags too), and `multipleOf` for integers (a whole one on numbers writes integers), enforced
exactly: a digit is allowed only if some completion is in range (bounded numbers are written without an
exponent); `pattern` (regex.py: the ECMA-262 subset real schemas use, as
a DFA over characters; a patterned string uses no escapes but `\\"`, `\\\\` and `\\/`, and non-ASCII
characters only where every such character fits), and `format` date, time, date-time, uuid, email, ipv4,
ipv6 and uri, written to a pattern of that format (other formats are annotations, not checked; with
`pattern` beside it, `format` is not checked either). Annotations and keywords no draft defines
(`x-...`, `readonly`, ...) are ignored, as the specification says; `json_grammar(..., strict=True)`
refuses the latter. `patternProperties` (when all its patterns share one schema) and `propertyNames`
(pattern, lengths) shape undeclared keys. Constraints that are not supported (not, if/then/else,
contains, uniqueItems, a fractional multipleOf on numbers, ...) are refused with an
`InvalidArgumentError` naming the keyword and where it is. A schema no document can meet is refused with
the reason (e.g. a required property whose schema is false); a part of it no document can meet (an
optional property, an anyOf option) is never started. Sub-schemas nested deeper than MAX_SCHEMA_DEPTH
(100, references and allOf parts included) are refused.

What is written, so that generation always ends:
- no whitespace between structural tokens (the compact form, as XGrammar and LLGuidance write it); with
  `whitespace="flexible"`, as llama.cpp's json-schema grammar: nothing, one space, or one or two
  newlines followed by at most 20 spaces or tabs; none before or after the whole value either way;
- integers of at most 16 digits, fractions of at most 16 digits, exponents of at most 3 digits;
- \\u escapes of UTF-16 surrogates (D800-DFFF) are refused (write the character in UTF-8 instead).
Once the output is a complete document (and suffix) EOS is allowed, and only EOS unless the document
can go on (a top-level number may take more digits: `Matcher.finished` says when it cannot).

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
- In a patterned string (`pattern`, `format`) plain text is read by the regex's DFA, run with NumPy over
  a trie of the tokens' characters folded by the character classes the DFA tells apart; the result for
  each regex state is kept, so a new parser state in a patterned string costs a few NumPy calls, not a
  walk of the whole vocabulary (pattern_tokens.py).
- The trie is flat lists, not 100k dicts, and the automaton has no reference cycles (it is freed with
  its grammar by reference counting), so they add little to garbage collection. (A full collection in
  a process holding a tokenizer still costs 10-20 ms now and then; `gc.freeze()` after loading
  removes that from generation.)


Files, in the order they build on each other:
- `vocabulary.py`: Vocabulary (the tokens as bytes, their tries and token classes), once per tokenizer.
- `regex.py`: Regex, a `pattern` as a DFA over characters.
- `nodes.py`: the nodes a schema compiles to.
- `parser.py`: configurations of frames read one byte at a time; the MAX_* limits of what is written.
- `pattern_tokens.py`: the tokens a patterned string can read, for each state of its regex.
- `automaton.py`: the lazy DFA of a grammar for one vocabulary, with each state's mask.
- `grammar.py`: Grammar, a compiled grammar that caches its automata.
- `resolve.py`: where sub-schemas live ($id, $anchor, JSON pointers).
- `combine.py`: allOf (and keywords beside $ref/anyOf) merged into one schema; JSON equality.
- `keywords.py`: each type's keywords read and checked into typed values, before schema.py emits nodes.
- `schema.py`: json_grammar, JSON Schema to Grammar, and what it refuses.
- `matcher.py`: Matcher, which follows one generation.
- `closing.py`: the closing of a document from any parser state, and Budgeted: a constraint that keeps
  one within the tokens left (max_tokens).
- `triggered.py`: Triggered, free text until a trigger tag, then one document (tool_choice "auto").

Dimension letters: V vocabulary size (the width of the logits).
"""

from .automaton import MAX_DFA_STATES
from .closing import Budgeted
from .grammar import Grammar
from .matcher import Matcher
from .parser import MAX_EXPONENT_DIGITS, MAX_FRACTION_DIGITS, MAX_INDENT, MAX_INT_DIGITS, MAX_NEWLINES
from .schema import MAX_ANY_ORDER, MAX_DOCUMENT_BYTES, MAX_SCHEMA_DEPTH, DocumentTooLongError, json_grammar
from .triggered import Triggered
from .vocabulary import Vocabulary

__all__ = [
    "MAX_ANY_ORDER",
    "MAX_DFA_STATES",
    "MAX_DOCUMENT_BYTES",
    "MAX_EXPONENT_DIGITS",
    "MAX_FRACTION_DIGITS",
    "MAX_INDENT",
    "MAX_INT_DIGITS",
    "MAX_NEWLINES",
    "MAX_SCHEMA_DEPTH",
    "Budgeted",
    "DocumentTooLongError",
    "Grammar",
    "Matcher",
    "Triggered",
    "Vocabulary",
    "json_grammar",
]
