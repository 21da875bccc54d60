"""A small PromQL parser for tests: enough to reject a malformed query in a shipped
Grafana dashboard and to list what it reads (metrics, label matchers, groupings).

It follows the PromQL grammar (operators and their precedence, aggregations with
``by``/``without`` before or after their arguments, functions, selectors, ranges,
subqueries, ``offset``) and accepts Grafana's ``$__rate_interval``-style range
variables. It does not type-check (a scalar where a vector is needed passes).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["Query", "Selector", "parse"]

AGGREGATIONS = {
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
    "bottomk", "topk", "quantile", "limitk", "limit_ratio",
}  # fmt: skip
FUNCTIONS = {
    "abs", "absent", "absent_over_time", "avg_over_time", "ceil", "changes", "clamp",
    "clamp_max", "clamp_min", "count_over_time", "day_of_month", "day_of_week", "delta",
    "deriv", "exp", "floor", "histogram_quantile", "holt_winters", "hour", "idelta",
    "increase", "irate", "label_join", "label_replace", "last_over_time", "ln", "log2",
    "log10", "max_over_time", "min_over_time", "minute", "month", "predict_linear",
    "quantile_over_time", "rate", "resets", "round", "scalar", "sgn", "sort", "sort_desc",
    "sqrt", "stddev_over_time", "stdvar_over_time", "sum_over_time", "time", "timestamp",
    "vector", "year",
}  # fmt: skip
# Lowest precedence first; "^" is right-associative.
LEVELS = [{"or"}, {"and", "unless"}, {"==", "!=", ">", "<", ">=", "<="}, {"+", "-"},
          {"*", "/", "%", "atan2"}, {"^"}]  # fmt: skip
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool"}

_TOKEN = re.compile(
    r"""\s*(?:
      (?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)(?![a-zA-Z_])
    | (?P<duration>(?:\d+(?:ms|s|m|h|d|w|y))+|\$__(?:rate_interval|interval|range))
    | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
    | (?P<name>[a-zA-Z_][a-zA-Z0-9_:]*)
    | (?P<op>==|!=|>=|<=|=~|!~|[-+*/%^<>=(){}\[\],:])
    )""",
    re.VERBOSE,
)


@dataclass(frozen=True)
class Selector:
    metric: str | None
    matchers: tuple[tuple[str, str, str], ...]  # (label, operator, value)


@dataclass
class Query:
    selectors: list[Selector] = field(default_factory=list)
    groupings: list[str] = field(default_factory=list)  # labels of by/without/on/ignoring
    calls: list[str] = field(default_factory=list)


def tokens(text: str) -> list[tuple[str, str]]:
    found, at = [], 0
    text = text.rstrip()
    while at < len(text):
        match = _TOKEN.match(text, at)
        if match is None or match.end() == at:
            raise ValueError(f"unexpected {text[at : at + 20]!r} at {at}")
        kind = match.lastgroup
        assert kind is not None
        found.append((kind, match.group(kind)))
        at = match.end()
    return found


class _Parser:
    def __init__(self, text: str) -> None:
        self.toks = tokens(text)
        self.i = 0
        self.query = Query()

    def peek(self) -> tuple[str, str] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self, value: str | None = None, kind: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (value is not None and tok[1] != value) or (kind and tok[0] != kind):
            raise ValueError(f"expected {value or kind!r}, found {tok!r} at token {self.i}")
        self.i += 1
        return tok[1]

    def value(self) -> str:
        """The current token's text; "" at the end."""
        tok = self.peek()
        return tok[1] if tok is not None else ""

    def at(self, value: str) -> bool:
        tok = self.peek()
        return tok is not None and tok[1] == value

    def parse(self) -> Query:
        self.expr(0)
        if self.peek() is not None:
            raise ValueError(f"trailing {self.peek()!r}")
        return self.query

    def expr(self, level: int) -> None:
        if level == len(LEVELS):
            self.unary()
            return
        self.expr(level + 1)
        while (tok := self.peek()) is not None and tok[1] in LEVELS[level]:
            self.i += 1
            if self.at("bool"):
                self.i += 1
            if self.value() in ("on", "ignoring"):
                self.i += 1
                self.labels()
                if self.value() in ("group_left", "group_right"):
                    self.i += 1
                    if self.at("("):
                        self.labels()
            # "^" binds to the right: parse the right side at the same level
            self.expr(level if LEVELS[level] == {"^"} else level + 1)

    def unary(self) -> None:
        if self.value() in ("-", "+"):
            self.i += 1
            self.unary()
            return
        self.primary()
        self.postfix()

    def postfix(self) -> None:
        if self.at("["):
            self.i += 1
            self.take(kind="duration")
            if self.at(":"):
                self.i += 1
                if not self.at("]"):
                    self.take(kind="duration")
            self.take("]")
        if self.at("offset"):
            self.i += 1
            if self.at("-"):
                self.i += 1
            self.take(kind="duration")

    def primary(self) -> None:
        tok = self.peek()
        if tok is None:
            raise ValueError("unexpected end of query")
        kind, value = tok
        if kind in ("number", "string"):
            self.i += 1
        elif value == "(":
            self.i += 1
            self.expr(0)
            self.take(")")
        elif value == "{":
            self.selector(None)
        elif kind == "name" and value in AGGREGATIONS:
            self.i += 1
            self.query.calls.append(value)
            self.modifier()
            self.args()
            self.modifier()
        elif kind == "name" and value in FUNCTIONS and self.toks[self.i + 1 :][:1] == [("op", "(")]:
            self.i += 1
            self.query.calls.append(value)
            self.args()
        elif kind == "name" and value not in KEYWORDS:
            self.i += 1
            self.selector(value)
        else:
            raise ValueError(f"unexpected {value!r}")

    def modifier(self) -> None:
        if self.at("by") or self.at("without"):
            self.i += 1
            self.labels()

    def labels(self) -> None:
        self.take("(")
        while not self.at(")"):
            self.query.groupings.append(self.take(kind="name"))
            if not self.at(")"):
                self.take(",")
        self.take(")")

    def args(self) -> None:
        self.take("(")
        if not self.at(")"):
            self.expr(0)
            while self.at(","):
                self.i += 1
                self.expr(0)
        self.take(")")

    def selector(self, metric: str | None) -> None:
        matchers: list[tuple[str, str, str]] = []
        if self.at("{"):
            self.i += 1
            while not self.at("}"):
                label = self.take(kind="name")
                op = self.take(kind="op")
                if op not in ("=", "!=", "=~", "!~"):
                    raise ValueError(f"bad label matcher operator {op!r}")
                raw = self.take(kind="string")
                matchers.append((label, op, raw[1:-1]))
                if not self.at("}"):
                    self.take(",")
            self.take("}")
        if metric is None and not matchers:
            raise ValueError("a selector needs a metric name or a matcher")
        self.query.selectors.append(Selector(metric, tuple(matchers)))


def parse(text: str) -> Query:
    """What ``text`` reads; raises ``ValueError`` when it is not PromQL."""
    return _Parser(text).parse()
