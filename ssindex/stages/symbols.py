"""What a tree-sitter node defines: the kind and qualified name of its symbol, which
names a chunk (``stages.chunk``) and feeds the symbol filters and ranking."""

from __future__ import annotations

from typing import Any

DEFINITION_KINDS: dict[str, str] = {
    "function_definition": "function", "function_declaration": "function",
    "function_item": "function", "generator_function_declaration": "function",
    "method_definition": "method", "method_declaration": "method", "method": "method",
    "singleton_method": "method", "constructor_declaration": "method",
    "class_definition": "class", "class_declaration": "class", "class_specifier": "class",
    "class": "class", "record_declaration": "class", "object_declaration": "object",
    "object_definition": "object", "interface_declaration": "interface",
    "protocol_declaration": "interface", "trait_item": "trait", "trait_declaration": "trait",
    "trait_definition": "trait", "struct_item": "struct", "struct_specifier": "struct",
    "struct_declaration": "struct", "enum_item": "enum", "enum_declaration": "enum",
    "impl_item": "impl", "mod_item": "module", "module": "module",
    "namespace_definition": "namespace", "namespace_declaration": "namespace",
    "type_declaration": "type", "type_alias_declaration": "type",
}
CHUNK_KINDS = frozenset({*DEFINITION_KINDS.values(), "module"})
"""Every kind a chunk can have: what it defines, or ``module`` (the code between)."""
CONTAINER_KINDS = frozenset({"class", "object", "interface", "trait", "struct", "impl", "enum"})
NAME_TYPES = frozenset({
    "identifier", "type_identifier", "field_identifier", "property_identifier",
    "simple_identifier", "constant", "name", "qualified_identifier", "scoped_identifier",
    "word",
})


def sole_definition(root: Any, module: tuple[str, str]) -> tuple[str, str] | None:
    """A file that defines exactly one top-level symbol is named for it, not for the file."""
    found = [d for child in root.named_children if "comment" not in child.type
             and (d := definition(child, module)) is not None]
    return found[0] if len(found) == 1 else None


def definition(node: Any, ctx: tuple[str, str]) -> tuple[str, str] | None:
    """(qualified name, kind) when ``node`` defines a named symbol."""
    if node.type == "decorated_definition":
        inner = node.child_by_field_name("definition")
        return definition(inner, ctx) if inner is not None else None
    kind = DEFINITION_KINDS.get(node.type)
    if kind is None:
        return None
    name = _name(node)
    if not name:
        return None
    if kind == "function" and ctx[1] in CONTAINER_KINDS:
        kind = "method"
    if ctx[1] != "module":
        name = f"{ctx[0]}.{name}"
    return name, kind


def _name(node: Any) -> str | None:
    target = node.child_by_field_name("name")
    if target is None and node.type == "impl_item":
        target = node.child_by_field_name("type")
    declarator = node.child_by_field_name("declarator")
    while target is None and declarator is not None:
        if declarator.type in NAME_TYPES:
            target = declarator
            break
        declarator = declarator.child_by_field_name("declarator") or next(
            (c for c in declarator.named_children if c.type in NAME_TYPES), None
        )
    if target is None:
        target = next((c for c in node.named_children if c.type in NAME_TYPES), None)
    if target is None:
        spec = next((c for c in node.named_children if c.type == "type_spec"), None)
        target = spec.child_by_field_name("name") if spec is not None else None
    if target is None or target.text is None:
        return None
    return target.text.decode("utf-8", errors="replace").strip()[:200] or None
