"""Reading a Prometheus text exposition in tests."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["Scrape"]


@dataclass(frozen=True)
class Scrape:
    """Every sample of one exposition: (name, labels, value)."""

    samples: tuple[tuple[str, dict[str, str], float], ...]

    @classmethod
    def parse(cls, text: str) -> Scrape:
        return cls(
            tuple(
                (s.name, dict(s.labels), s.value)
                for family in text_string_to_metric_families(text)
                for s in family.samples
            )
        )

    def value(self, name: str, **labels: str) -> float:
        """The sum of ``name``'s samples whose labels include ``labels`` (0 if none)."""
        return sum(v for n, ls, v in self.samples if n == name and labels.items() <= ls.items())

    def names(self) -> set[str]:
        return {n for n, _, _ in self.samples}

    def label_values(self) -> set[str]:
        """Every label value of every sample (``le`` buckets included)."""
        return {v for _, ls, _ in self.samples for v in ls.values()}

    def decisions(self, **labels: str) -> float:
        return self.value("flask_quota_decisions_total", **labels)
