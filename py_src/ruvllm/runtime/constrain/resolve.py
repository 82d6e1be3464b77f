"""Where sub-schemas live: `$id` (draft-04 `id`), `$anchor` and JSON pointers, resolved as JSON Schema
2020-12 says (section 8.2, 9). schema.py compiles; this module only finds schemas.

A location is (uri, pointer): the absolute URI of the schema resource (the root, or the nearest enclosing
schema with an `$id`) and the path of keys from that resource to the sub-schema. `Resources.resolve`
turns a `$ref` read at one location into the schema it points to and that schema's own location, so that
relative references inside it are read against the right base. Nothing is fetched: a reference to a
resource outside the document is refused by the caller.
"""

from __future__ import annotations

from urllib.parse import quote, unquote, urldefrag, urljoin

ROOT_URI = "urn:ruvllm:root"  # the base of a root schema without an `$id`

# The keywords whose values are schemas, a list of schemas, or an object of schemas: where ids and
# anchors are looked for (a property *named* "$id" in `properties` is not an identifier).
_SCHEMA = frozenset(
    {"additionalProperties", "items", "not", "if", "then", "else", "contains", "propertyNames"}
    | {"unevaluatedItems", "unevaluatedProperties", "additionalItems", "contentSchema"}
)
_SCHEMA_LIST = frozenset({"allOf", "anyOf", "oneOf", "prefixItems", "items"})
_SCHEMA_MAP = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})

Location = tuple[str, tuple[str, ...]]


def join(base: str, reference: str) -> str:
    """`reference` read against `base` (urljoin, which leaves URNs and fragments alone, is helped)."""
    if reference.startswith("#"):
        return urldefrag(base)[0] + reference
    if ":" in reference.split("/")[0]:  # absolute already
        return reference
    if base.startswith("urn:"):  # a relative reference against a URN: not resolvable; keep it as is
        return reference
    return urljoin(base, reference)


def pointer_uri(location: Location) -> str:
    """The absolute URI of a location, as a `$ref` to it would be written."""
    uri, pointer = location
    return uri + "#" + "".join("/" + quote(p.replace("~", "~0").replace("/", "~1"), safe="") for p in pointer)


def own_id(schema: dict, draft4: bool) -> str | None:
    value = schema.get("$id")
    if value is None and draft4:
        value = schema.get("id")
    return value if isinstance(value, str) else None


class Resources:
    """The schema resources of one document: every `$id` and `$anchor` in it, found once."""

    def __init__(self, root: object) -> None:
        self.root = root
        schema_uri = root.get("$schema", "") if isinstance(root, dict) else ""
        self.draft4 = isinstance(schema_uri, str) and ("draft-04" in schema_uri or "draft-03" in schema_uri)
        self.resources: dict[str, object] = {ROOT_URI: root}
        self.anchors: dict[str, tuple[object, Location]] = {}  # uri#name -> (schema, location)
        self.root_uri = ROOT_URI
        if isinstance(root, dict) and own_id(root, self.draft4) is not None:
            self.root_uri = urldefrag(join(ROOT_URI, own_id(root, self.draft4) or ""))[0] or ROOT_URI
            self.resources[self.root_uri] = root
        self._index(root, (self.root_uri, ()), 0)

    def enter(self, schema: dict, location: Location) -> Location:
        """The location of `schema`'s contents: a new resource if it has an `$id`."""
        identifier = own_id(schema, self.draft4)
        if identifier is None or location[1] == ():
            return location
        uri, fragment = urldefrag(join(location[0], identifier))
        return (uri, ()) if uri and not fragment else location

    def _index(self, schema: object, location: Location, depth: int) -> None:
        if not isinstance(schema, dict) or depth > 200:
            return
        location = self.enter(schema, location)
        uri = location[0]
        if location[1] == () and uri not in self.resources:
            self.resources[uri] = schema
        identifier = own_id(schema, self.draft4)
        if identifier is not None and "#" in identifier:  # draft-04 style: "id": "#name" is an anchor
            target, fragment = urldefrag(join(uri, identifier))
            if fragment and not fragment.startswith("/"):
                self.anchors[f"{target}#{fragment}"] = (schema, location)
        for keyword in ("$anchor", "$dynamicAnchor"):
            if isinstance(schema.get(keyword), str):
                self.anchors[f"{uri}#{schema[keyword]}"] = (schema, location)
        pointer = location[1]
        for key, value in schema.items():
            if key in _SCHEMA:
                self._index(value, (uri, (*pointer, key)), depth + 1)
            if key in _SCHEMA_LIST and isinstance(value, list):
                for i, sub in enumerate(value):
                    self._index(sub, (uri, (*pointer, key, str(i))), depth + 1)
            if key in _SCHEMA_MAP and isinstance(value, dict):
                for name, sub in value.items():
                    self._index(sub, (uri, (*pointer, key, name)), depth + 1)

    def outside(self, reference: str, base: str) -> bool:
        """Whether a `$ref` points to another document (which is not fetched)."""
        return urldefrag(join(base, reference))[0] not in self.resources

    def resolve(self, reference: str, base: str) -> tuple[str, object, Location] | None:
        """(the absolute target, its schema, its location) of a `$ref` read against `base`; None if it
        points outside the document or to nothing."""
        target = join(base, reference)
        uri, fragment = urldefrag(target)
        if uri not in self.resources:
            return None
        if fragment and not fragment.startswith("/"):
            found = self.anchors.get(f"{uri}#{unquote(fragment)}")
            return None if found is None else (target, *found)
        schema: object = self.resources[uri]
        location: Location = (uri, ())
        parts = [unquote(p).replace("~1", "/").replace("~0", "~") for p in fragment.split("/")[1:]]
        for part in parts:
            if isinstance(schema, dict):
                location = self.enter(schema, location)
                if part not in schema:
                    return None
                schema = schema[part]
            elif isinstance(schema, list) and part.isdigit() and int(part) < len(schema):
                schema = schema[int(part)]
            else:
                return None
            location = (location[0], (*location[1], part))
        return uri + "#" + fragment if fragment else uri, schema, location
