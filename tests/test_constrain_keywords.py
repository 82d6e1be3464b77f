"""The typed stage of the schema compiler (runtime/constrain/keywords.py): each type's keywords read and
checked once, into the values schema.py emits nodes from (test_constrain.py tests the grammars)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from ruvllm.errors import InvalidArgumentError
from ruvllm.runtime.constrain.keywords import ArraySchema, DocumentTooLongError, KeywordReader, NoValueError
from ruvllm.runtime.constrain.nodes import Number, String


def test_a_strings_keywords_read_into_its_node_with_lengths_bounded_by_the_document():
    read = KeywordReader(max_bytes=100)
    node = read.string({"minLength": 2, "maxLength": 10**9, "format": "date"}, ())
    assert isinstance(node, String) and (node.min_length, node.max_length, node.cap) == (2, 100, 100)
    assert node.pattern is not None and node.pattern.matches("2024-02-29") and not node.pattern.matches("2024-02-30")
    with pytest.raises(DocumentTooLongError, match="'minLength' 1,000 at s needs more than the 100 bytes"):
        read.string({"minLength": 1000}, ("s",))


def test_number_keywords_read_into_the_bounds_the_node_enforces():
    read = KeywordReader(max_bytes=1000)
    assert read.number({"exclusiveMinimum": 1.5, "maximum": 7}, "integer", ()) == Number(True, 2, 7)
    assert read.number({"minimum": 1, "exclusiveMinimum": True}, "integer", ()) == Number(True, 2, None)  # draft-04
    assert read.number({"multipleOf": 3}, "number", ()) == Number(True, None, None, multiple_of=3)  # whole: integers
    assert read.number({"minimum": 0.5, "exclusiveMaximum": 2}, "number", ()) == Number(
        False, Fraction(1, 2), Fraction(2), open_max=True
    )


@pytest.mark.parametrize(
    ("kind", "schema", "why"),
    [
        ("string", {"minLength": 3, "maxLength": 2}, "'minLength' 3 is more than 'maxLength' 2"),
        ("string", {"pattern": "^a+$", "format": "uuid"}, "no string matches both 'pattern'"),
        ("integer", {"minimum": 1, "maximum": 2, "multipleOf": 5}, r"within the bounds \[1, 2\] and a multiple of 5"),
        ("number", {"minimum": 1, "exclusiveMaximum": 1}, "no number of at most 16 integer digits"),
        ("array", {"items": [{}], "additionalItems": False, "minItems": 2}, "'minItems' 2 is more than 'maxItems' 1"),
    ],
)
def test_keywords_that_together_allow_no_value_raise_no_value_error_with_the_reason(kind, schema, why):
    read = KeywordReader(max_bytes=1000)
    with pytest.raises(NoValueError, match=why):
        if kind == "array":
            read.array(schema, ())
        elif kind == "string":
            read.string(schema, ())
        else:
            read.number(schema, kind, ())


def test_an_arrays_and_an_objects_sub_schemas_stay_raw_for_the_compiler():
    read = KeywordReader(max_bytes=1000)
    array = read.array({"items": [{"type": "string"}, {}], "additionalItems": False, "maxItems": 1}, ())
    assert array == ArraySchema("items", ({"type": "string"},), "additionalItems", False, 0, 1)
    schema = {
        "properties": {"a": {"type": "integer"}},
        "required": ["a", "a"],
        "dependentRequired": {"a": ["b", "a"]},
        "propertyNames": {"maxLength": 3},
        "maxProperties": 4,
    }
    obj = read.object(schema, ())
    assert obj.properties == {"a": {"type": "integer"}} and obj.required == ("a",) and obj.additional is True
    assert obj.dependencies == {"a": ("b",)} and (obj.min_properties, obj.max_properties) == (0, 4)
    assert obj.closed_if_empty and not obj.explicit
    assert obj.names.allows("abc") and not obj.names.allows("abcd") and obj.names.patterns is None
    patterned = read.object({"patternProperties": {"^x": {}, "^y": {}}, "propertyNames": False}, ())
    assert patterned.names.none and not patterned.names.allows("x")


def test_a_malformed_keyword_is_refused_naming_it_and_where_it_is():
    read = KeywordReader(max_bytes=1000)
    with pytest.raises(InvalidArgumentError, match=r"'minItems' must be a non-negative integer, got -1 at a\.b"):
        read.array({"minItems": -1}, ("a", "b"))
    with pytest.raises(InvalidArgumentError, match="'maximum' must be a finite number, got 'x' at the root"):
        read.number({"maximum": "x"}, "number", ())
    with pytest.raises(InvalidArgumentError, match="'dependentRequired' must map names to lists of names"):
        read.object({"dependentRequired": {"a": "b"}}, ())
