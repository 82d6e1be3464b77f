"""The nodes a JSON Schema compiles to (schema.py makes them, parser.py reads them).

A grammar is a list of these; a node refers to others by their index in the list, so recursive schemas
($ref) are plain cycles of indexes.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from .regex import Regex


@dataclass(frozen=True)
class Property:
    key: bytes  # the key as JSON text, quotes included
    value: int  # node id
    required: bool


@dataclass(frozen=True)
class Object:
    properties: tuple[Property, ...]
    free_value: int | None  # free keys with values of this node (then `properties` is empty)
    free_key: int | None  # the string node of free keys
    last_candidate: tuple[int, ...]  # [i]: the last property that may come next after i (a required one)
    closable: tuple[bool, ...]  # [i]: no required property at i or later
    extra_value: int | None = None  # undeclared keys, between the properties, with values of this node
    extra_key: int | None = None  # the string node of undeclared keys
    excluded: tuple[bytes, ...] = ()  # declared keys no value can follow: not undeclared keys either
    any_order: bool = False  # properties in any order (each at most once): frames track those written
    required_bits: int = 0  # any_order: the bit (1 << index) of each required property
    dependencies: tuple[tuple[int, int], ...] = ()  # any_order: (property bit, bits it requires)
    min_properties: int = 0  # any_order: minProperties (undeclared keys count once: they may repeat)
    max_properties: int = -1  # any_order: maxProperties (-1: none; undeclared keys count each time)


@dataclass(frozen=True)
class Array:
    item: int | None  # the items after `prefix`; None: no more items are allowed
    min_items: int
    max_items: int  # -1: unbounded
    cap: int  # counts stop here: nothing beyond it is checked (at least len(prefix))
    prefix: tuple[int, ...] = ()  # the first items, one node each (prefixItems)


@dataclass(frozen=True)
class String:
    min_length: int
    max_length: int  # -1: unbounded
    cap: int
    pattern: Regex | None = None  # the characters must match it (JSON Schema `pattern`, `format`)


@dataclass(frozen=True)
class Number:
    integer: bool
    minimum: int | Fraction | None  # integers: int, inclusive; numbers: a Fraction, exclusive if open_min
    maximum: int | Fraction | None
    open_min: bool = False
    open_max: bool = False
    multiple_of: int = 1  # integers: multipleOf (the value is then tracked, as with bounds)


@dataclass(frozen=True)
class Literal:
    values: tuple[bytes, ...]  # sorted JSON texts


@dataclass(frozen=True)
class Union:
    options: tuple[int, ...]
