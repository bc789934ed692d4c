"""JSON Schemas for the structured-output suite: what extraction and agent clients send (nested
objects, arrays with minItems/maxItems, enums, patterns, numeric ranges, required,
additionalProperties false, anyOf, $ref, tuples, nullable fields), each with a short prompt."""

from __future__ import annotations

from typing import Any


def obj(props: dict[str, Any], required: list[str] | None = None, closed: bool = True) -> dict:
    s: dict[str, Any] = {"type": "object", "properties": props}
    s["required"] = list(props) if required is None else required
    if closed:
        s["additionalProperties"] = False
    return s


STR, INT, NUM, BOOL = (
    {"type": "string"},
    {"type": "integer"},
    {"type": "number"},
    {"type": "boolean"},
)
SHORT = {"type": "string", "maxLength": 40}

SCHEMAS: list[tuple[str, dict[str, Any]]] = [
    ("a person", obj({"name": STR, "age": {"type": "integer", "minimum": 0, "maximum": 120}})),
    ("a city", obj({"city": STR, "country": STR, "population": {"type": "integer", "minimum": 0}})),
    ("a book", obj({"title": STR, "author": STR, "year": {"type": "integer", "minimum": 1400,
                                                          "maximum": 2030}})),
    ("a product", obj({"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                       "price": {"type": "number", "minimum": 0, "maximum": 10000},
                       "in_stock": BOOL})),
    ("a colour choice", obj({"colour": {"enum": ["red", "green", "blue"]}})),
    ("a weather report", obj({"city": SHORT, "temp_c": {"type": "number", "minimum": -60,
                                                        "maximum": 60},
                              "sky": {"enum": ["sunny", "cloudy", "rain", "snow"]}})),
    ("a shopping list", obj({"items": {"type": "array", "items": SHORT, "minItems": 1,
                                       "maxItems": 5}})),
    ("an address", obj({"street": STR, "city": STR, "zip": {"type": "string",
                                                            "pattern": "^[0-9]{5}$"}})),
    ("a user with an address", obj({"name": STR, "address": obj({"street": STR, "city": STR})})),
    ("an order", obj({"id": {"type": "integer", "minimum": 1}, "lines": {
        "type": "array", "minItems": 1, "maxItems": 3,
        "items": obj({"sku": SHORT, "qty": {"type": "integer", "minimum": 1, "maximum": 99}})}})),
    ("a yes/no answer", obj({"answer": {"enum": ["yes", "no"]}, "confidence": {
        "type": "number", "minimum": 0, "maximum": 1}})),
    ("a date", obj({"date": {"type": "string", "pattern": "^\\d{4}-\\d{2}-\\d{2}$"}})),
    ("a time of day", obj({"hour": {"type": "integer", "minimum": 0, "maximum": 23},
                           "minute": {"type": "integer", "minimum": 0, "maximum": 59}})),
    ("an email contact", obj({"name": SHORT, "email": {
        "type": "string", "pattern": "^[a-z0-9.]+@[a-z0-9]+\\.[a-z]{2,4}$"}})),
    ("a team", obj({"team": SHORT, "members": {"type": "array", "minItems": 2, "maxItems": 4,
                                               "items": obj({"name": SHORT, "role": {
                                                   "enum": ["lead", "dev", "qa"]}})}})),
    ("tags", obj({"tags": {"type": "array", "items": {"enum": ["a", "b", "c", "d"]},
                           "minItems": 0, "maxItems": 3}})),
    ("a rating", obj({"stars": {"type": "integer", "minimum": 1, "maximum": 5},
                      "comment": SHORT})),
    ("a coordinate", obj({"lat": {"type": "number", "minimum": -90, "maximum": 90},
                          "lon": {"type": "number", "minimum": -180, "maximum": 180}})),
    ("a pet", obj({"kind": {"enum": ["cat", "dog", "fish"]}, "name": SHORT,
                   "vaccinated": BOOL})),
    ("optional fields", obj({"a": STR, "b": INT, "c": BOOL}, required=["a"])),
    ("an id or a name", obj({"ref": {"anyOf": [{"type": "integer", "minimum": 0}, SHORT]}})),
    ("a nullable note", obj({"note": {"type": ["string", "null"], "maxLength": 30}})),
    ("a matrix", obj({"rows": {"type": "array", "minItems": 2, "maxItems": 2, "items": {
        "type": "array", "minItems": 2, "maxItems": 2, "items": {"type": "integer",
                                                                 "minimum": -9,
                                                                 "maximum": 9}}}})),
    ("a version", obj({"version": {"type": "string", "pattern": "^v\\d+\\.\\d+\\.\\d+$"}})),
    ("a status", obj({"status": {"const": "ok"}, "code": {"enum": [200, 201, 204]}})),
    ("an event", obj({"title": SHORT, "attendees": {"type": "integer", "minimum": 0,
                                                     "exclusiveMaximum": 1000},
                      "public": BOOL})),
    ("a movie", obj({"title": SHORT, "genres": {"type": "array", "minItems": 1, "maxItems": 3,
                                                "items": {"enum": ["drama", "comedy",
                                                                   "action", "horror"]}},
                     "year": {"type": "integer", "minimum": 1900, "maximum": 2030}})),
    ("a recipe", obj({"name": SHORT, "minutes": {"type": "integer", "minimum": 1,
                                                  "maximum": 600},
                      "ingredients": {"type": "array", "minItems": 1, "maxItems": 4,
                                      "items": obj({"item": SHORT, "grams": {
                                          "type": "number", "minimum": 0, "maximum": 5000}})}})),
    ("a login", obj({"username": {"type": "string", "pattern": "^[a-z][a-z0-9_]{2,15}$"},
                     "remember": BOOL})),
    ("a sentiment", obj({"label": {"enum": ["positive", "negative", "neutral"]},
                         "score": {"type": "number", "minimum": -1, "maximum": 1}})),
    ("a company", obj({"name": SHORT, "employees": {"type": "integer", "minimum": 1},
                       "hq": obj({"city": SHORT, "country": {"type": "string",
                                                              "pattern": "^[A-Z]{2}$"}})})),
    ("a point list", obj({"points": {"type": "array", "minItems": 1, "maxItems": 3,
                                     "items": obj({"x": INT, "y": INT})}})),
    ("a flag set", obj({"debug": BOOL, "verbose": BOOL, "dry_run": BOOL})),
    ("a hex colour", obj({"hex": {"type": "string", "pattern": "^#[0-9a-f]{6}$"}})),
    ("a shape", {"anyOf": [obj({"circle": obj({"r": {"type": "number", "minimum": 0}})}),
                           obj({"square": obj({"side": {"type": "number", "minimum": 0}})})]}),
    ("a tree node", {"$defs": {"leaf": obj({"value": INT})},
                     **obj({"name": SHORT, "children": {"type": "array", "maxItems": 2,
                                                        "items": {"$ref": "#/$defs/leaf"}}})}),
    ("a pair", obj({"pair": {"type": "array", "prefixItems": [SHORT, INT], "items": False,
                             "minItems": 2}})),
    ("a survey answer", obj({"q1": {"enum": ["A", "B", "C"]}, "q2": {"enum": ["A", "B", "C"]},
                             "free_text": {"type": "string", "maxLength": 20}})),
    ("a temperature reading", obj({"celsius": {"type": "number", "exclusiveMinimum": -273.15,
                                               "maximum": 100}})),
    ("a percent", obj({"percent": {"type": "integer", "minimum": 0, "maximum": 100}})),
    ("a phone", obj({"phone": {"type": "string", "pattern": "^\\+[0-9]{2} [0-9]{3} [0-9]{4}$"}})),
    ("a log line", obj({"level": {"enum": ["DEBUG", "INFO", "WARN", "ERROR"]},
                        "message": SHORT, "line": {"type": "integer", "minimum": 1}})),
    ("a short word", obj({"word": {"type": "string", "minLength": 3, "maxLength": 8}})),
    ("an invoice", obj({"number": {"type": "string", "pattern": "^INV-[0-9]{6}$"},
                        "total": {"type": "number", "minimum": 0},
                        "paid": BOOL,
                        "customer": obj({"name": SHORT, "vip": BOOL}, required=["name"])})),
    ("a nested config", obj({"server": obj({"host": SHORT, "port": {"type": "integer",
                                                                    "minimum": 1,
                                                                    "maximum": 65535},
                                            "tls": obj({"enabled": BOOL})})})),
    ("a list of numbers", obj({"values": {"type": "array", "minItems": 3, "maxItems": 6,
                                          "items": {"type": "number", "minimum": 0,
                                                    "maximum": 10}}})),
    ("an answer with sources", obj({"answer": SHORT, "sources": {
        "type": "array", "maxItems": 2, "items": obj({"url": {"type": "string",
                                                              "pattern": "^https://[a-z]+\\.com$"},
                                                      "page": {"type": "integer",
                                                               "minimum": 1}})}})),
    ("a translation", obj({"source": {"enum": ["en", "fr", "de"]},
                           "target": {"enum": ["en", "fr", "de"]}, "text": SHORT})),
    ("a game score", obj({"home": {"type": "integer", "minimum": 0, "maximum": 20},
                          "away": {"type": "integer", "minimum": 0, "maximum": 20},
                          "final": BOOL})),
    ("a dimension", obj({"width": {"type": "number", "minimum": 0.1, "maximum": 99.9},
                         "height": {"type": "number", "minimum": 0.1, "maximum": 99.9},
                         "unit": {"enum": ["cm", "in"]}})),
    ("a task", obj({"title": SHORT, "priority": {"enum": ["low", "medium", "high"]},
                    "done": BOOL, "subtasks": {"type": "array", "maxItems": 2,
                                               "items": SHORT}})),
    ("a key-value map", {"type": "object", "additionalProperties": INT, "maxProperties": 3}),
    ("a discriminated union", obj({"item": {"oneOf": [
        obj({"kind": {"const": "book"}, "pages": {"type": "integer", "minimum": 1}}),
        obj({"kind": {"const": "film"}, "minutes": {"type": "integer", "minimum": 1}})]}})),
    ("a merged profile", {"allOf": [obj({"id": INT}, closed=False),
                                    {"properties": {"email": SHORT}, "required": ["email"]}]}),
    ("an open record", {"type": "object", "required": ["id"], "properties": {"id": INT}}),
]  # fmt: skip


def prompt(what: str) -> str:
    return f"Answer with JSON only. Describe {what}."
