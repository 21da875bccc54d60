"""Turning measurements into ``bench/results.md``: tables, ratios and the target check."""

from __future__ import annotations

from dataclasses import dataclass, field

from .apps import LIMITER_STRATEGY
from .compare import LABELS, Comparison, main_ratios
from .footprint import ProcessFootprint, RedisFootprint
from .growth import GrowthRow
from .latency import SHORT, Latency
from .roundtrips import RoundTripRow
from .throughput import Throughput

FL = "Flask-Limiter"
RAW = "raw/evalsha-decide3"
SB = "token_bucket"


@dataclass
class Results:
    machine: dict[str, str]
    quick: bool
    command: str
    seconds: float = 0.0
    roundtrips: list[RoundTripRow] = field(default_factory=list)
    latency: dict[str, Latency] = field(default_factory=dict)
    latency_rounds: tuple[int, int] = (0, 0)
    throughput: dict[str, Throughput] = field(default_factory=dict)
    throughput_rounds: tuple[int, float] = (0, 0.0)
    load_generator: str = ""
    redis_footprint: list[RedisFootprint] = field(default_factory=list)
    process_footprint: list[ProcessFootprint] = field(default_factory=list)
    growth: list[GrowthRow] = field(default_factory=list)
    growth_rounds: tuple[int, int] = (0, 0)
    compare: Comparison | None = None
    compare_rounds: tuple[int, int] = (0, 0)


@dataclass(frozen=True)
class Target:
    number: str
    text: str
    measured: str
    met: bool | None  # None: not measured in this run


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b <= 0:
        return None
    return a / b


def _added(r: Results, key: str) -> float | None:
    lat = r.latency.get(key)
    return None if lat is None else lat.added_us


def _median(r: Results, key: str) -> float | None:
    lat = r.latency.get(key)
    return None if lat is None else lat.median_us


# -- targets ------------------------------------------------------------------


def targets(r: Results) -> list[Target]:
    out: list[Target] = []
    ours = [row for row in r.roundtrips if row.library == "flask-quota"]
    if ours:
        exact = [row for row in ours if row.outcome != "denied"]
        cached = [row for row in ours if row.outcome == "denied"]
        theirs3 = [row.sends for row in r.roundtrips if row.library == FL and row.tiers == 3]
        spans = [
            (min(min(x.sends, x.replies) for x in rows), max(max(x.sends, x.replies) for x in rows))
            for rows in (exact, cached)
        ]
        span = [f"{lo:g}" if lo == hi else f"{lo:g}-{hi:g}" for lo, hi in spans]
        out.append(
            Target(
                "1",
                "exactly 1 Redis round trip per request, every algorithm, 1-3 tiers, "
                "allowed and denied",
                f"{span[0]} in all {len(exact)} cases (allowed, and denied without the deny "
                f"cache); repeated denials with the default deny cache: {span[1]}. "
                "Flask-Limiter, 3 limits: "
                f"{min(theirs3):g}-{max(theirs3):g}",
                spans[0] == (1.0, 1.0) and spans[1][1] <= 1.0,
            )
        )
    else:
        out.append(Target("1", "1 round trip per request", "not run", None))
    if r.latency:
        ours_added = _added(r, "q/redis/tb/3")
        raw = _median(r, RAW)
        ratio = _ratio(ours_added, raw)
        out.append(
            Target(
                "2a",
                "Redis, 3 tiers: added latency <= 1.5 x one raw EVALSHA round trip",
                f"{_us(ours_added)} us added vs {_us(raw)} us raw EVALSHA of the same script "
                f"= {_x(ratio)} (vs `return 1`: "
                f"{_x(_ratio(ours_added, _median(r, 'raw/evalsha-return1')))}; vs the "
                f"floor (bare app + one EVALSHA of GET + SET PX on 3 keys), "
                f"{_us(_added(r, 'floor/in-request/decide3'))} us added: "
                f"{_x(_ratio(ours_added, _added(r, 'floor/in-request/decide3')))})",
                None if ratio is None else ratio <= 1.5,
            )
        )
        pairs = _pairings(r)
        worst_pair = min(pairs, key=lambda p: p[4] or 0.0) if pairs else None
        if worst_pair is not None:
            like = [p[5] for p in pairs if p[5] is not None]
            out.append(
                Target(
                    "2b",
                    "Redis, 3 tiers: >= 4x less added latency than Flask-Limiter",
                    f"least favourable pairing {worst_pair[0]} vs {worst_pair[1]} "
                    f"(Flask-Limiter without headers): {_x(worst_pair[4])}; with headers on "
                    f"both sides: {_x(min(like)) if like else '-'} to "
                    f"{_x(max(like)) if like else '-'}",
                    None if worst_pair[4] is None else worst_pair[4] >= 4.0,
                )
            )
        mem = _added(r, "q/mem/tb/3")
        out.append(
            Target(
                "2c",
                "memory backend, 3 tiers: <= 30 us added",
                f"{_us(mem)} us (Flask-Limiter memory://, 3 limits: "
                f"{_us(_added(r, 'fl/mem/fixed-window/3/h0'))} us)",
                None if mem is None else mem <= 30.0,
            )
        )
    else:
        out.append(Target("2", "added latency", "not run", None))
    if r.throughput:
        ours_t = r.throughput["flask-quota"]
        to_bare = ours_t.ratio(r.throughput["bare"])
        to_fl = ours_t.ratio(r.throughput[FL])
        to_fl_h = ours_t.ratio(r.throughput[f"{FL} +headers"])
        out.append(
            Target(
                "3a",
                "gunicorn, Redis, 3 tiers: throughput >= 0.8 x bare app",
                f"{_x(to_bare)}",
                to_bare >= 0.8,
            )
        )
        out.append(
            Target(
                "3b",
                "gunicorn, Redis, 3 tiers: throughput >= 2x Flask-Limiter",
                f"{_x(to_fl)} (Flask-Limiter with headers: {_x(to_fl_h)})",
                to_fl >= 2.0,
            )
        )
    else:
        out.append(Target("3", "throughput", "not run", None))
    tb = [f for f in r.redis_footprint if f.library == "flask-quota" and f.algorithm == SB]
    if tb:
        out.append(
            Target(
                "4a",
                "Redis: <= 100 bytes per token-bucket key (MEMORY USAGE)",
                f"{tb[0].memory_usage:.1f} bytes",
                tb[0].memory_usage <= 100,
            )
        )
    inproc = [f for f in r.process_footprint if f.algorithm == SB]
    if inproc:
        f = inproc[0]
        peak = f.traced_per_key * f.keys
        share = f.traced_after_expiry / peak if peak else 0.0
        out.append(
            Target(
                "4b",
                f"memory backend: memory per key ({f.keys:,} keys), returned after expiry "
                "(<= 5% of the peak still held)",
                f"{f.traced_per_key:.0f} bytes/key at {f.keys:,} keys; after expiry "
                f"{f.keys_after_expiry} keys, {f.traced_after_expiry / 1e6:.1f} MB "
                f"({share:.1%} of peak) still held",
                f.keys_after_expiry == 0 and share <= 0.05,
            )
        )
    if not (tb or inproc):
        out.append(Target("4", "memory per key", "not run", None))
    tiers = _ratio(_added(r, "q/redis/tb/3"), _added(r, "q/redis/tb/1"))
    fl_tiers = _ratio(
        _added(r, "fl/redis/fixed-window/3/h0"), _added(r, "fl/redis/fixed-window/1/h0")
    )
    if tiers is not None:
        out.append(
            Target(
                "5a",
                "growth 1 -> 3 tiers (Redis): flat (3 tiers <= 1.25 x 1 tier)",
                f"{_x(tiers)} (Flask-Limiter: {_x(fl_tiers)})",
                tiers <= 1.25,
            )
        )
    if r.growth:
        for backend in ("memory", "redis"):
            rows = sorted((g for g in r.growth if g.backend == backend), key=lambda g: g.population)
            ratio = _ratio(rows[-1].added_us, rows[0].added_us)
            out.append(
                Target(
                    "5b",
                    f"growth {rows[0].population:,} -> {rows[-1].population:,} active identities "
                    f"({backend}): flat (<= 1.25x)",
                    _x(ratio),
                    None if ratio is None else ratio <= 1.25,
                )
            )
    out += _compare_targets(r)
    return out


def _compare_targets(r: Results) -> list[Target]:
    """Issue 13's checks: from section 6 (one test-client run) and section 3."""
    c = r.compare
    out: list[Target] = []
    if c is not None:
        checks = [
            ("6a", "test client, Redis, 3 tiers: flask-quota / floor <= 1.25 (added us)",
             c.ratio("q/redis", "floor"), lambda x: x <= 1.25),
            ("6b", "test client, Redis, 3 tiers: Flask-Limiter (headers on) / flask-quota >= 3.5",
             c.ratio("fl/redis/h1", "q/redis"), lambda x: x >= 3.5),
            ("6c", "test client, memory, 3 tiers: Flask-Limiter (no headers) / flask-quota >= 4",
             c.ratio("fl/mem/h0", "q/mem"), lambda x: x >= 4.0),
        ]  # fmt: skip
        for number, text, ratio, ok in checks:
            out.append(Target(number, text, _x(ratio), None if ratio is None else ok(ratio)))
        mem = c.added_us.get("q/mem")
        out.append(
            Target(
                "6d",
                "test client, memory, 3 tiers: flask-quota adds <= 30 us per request",
                f"{_us(mem)} us",
                None if mem is None else mem <= 30.0,
            )
        )
    if r.throughput:
        to_bare = r.throughput["flask-quota"].ratio(r.throughput["bare"])
        floor = r.throughput.get("floor")
        out.append(
            Target(
                "6e",
                "gunicorn, Redis, 3 tiers: throughput >= 0.7 x bare app",
                _x(to_bare)
                + (
                    ""
                    if floor is None
                    else f" (the floor: {_x(floor.ratio(r.throughput['bare']))})"
                ),
                to_bare >= 0.7,
            )
        )
    return out


def _pairings(
    r: Results,
) -> list[tuple[str, str, float | None, float | None, float | None, float | None]]:
    """(ours, theirs, ours added, theirs added h0, ratio h0, ratio h1) on Redis, 3 tiers."""
    rows = []
    for algorithm, strategy in LIMITER_STRATEGY.items():
        ours = _added(r, f"q/redis/{SHORT[algorithm]}/3")
        h0 = _added(r, f"fl/redis/{strategy}/3/h0")
        h1 = _added(r, f"fl/redis/{strategy}/3/h1")
        rows.append((algorithm, strategy, ours, h0, _ratio(h0, ours), _ratio(h1, ours)))
    return rows


# -- sections -------------------------------------------------------------------


def _roundtrip_section(r: Results) -> str:
    index = {
        (row.library, row.algorithm, row.headers, row.tiers, row.outcome): row
        for row in r.roundtrips
    }

    def cell(library: str, algorithm: str, headers: str, tiers: int) -> str:
        outcomes = ["allowed", "denied"]
        if library == "flask-quota":
            outcomes.append("denied, no deny cache")
        found = [index.get((library, algorithm, headers, tiers, o)) for o in outcomes]
        return " / ".join("-" if x is None else f"{x.sends:g}" for x in found)

    rows = []
    for algorithm, strategy in LIMITER_STRATEGY.items():
        for tiers in (1, 2, 3):
            rows.append(
                [
                    algorithm,
                    str(tiers),
                    cell("flask-quota", algorithm, "both", tiers),
                    strategy,
                    cell(FL, strategy, "none (default)", tiers),
                    cell(FL, strategy, "X-RateLimit", tiers),
                ]
            )
    replies_match = all(row.sends == row.replies for row in r.roundtrips)
    return "\n\n".join(
        [
            "## 1. Redis round trips per request",
            "Cells are `allowed / denied` round trips per request (mean of the counted "
            "requests; warm-up excluded; denied = the endpoint tier is exhausted, the others "
            "allow). flask-quota's third number is denied with `QUOTA_DENY_CACHE=False`: by "
            "default a denial is remembered in-process until its retry time, so a repeated "
            "denied request costs no round trip (the first denial costs one). flask-quota "
            "always sends its headers; Flask-Limiter is shown without headers (its default) "
            "and with `headers_enabled=True`, which reads the window back from Redis after "
            "the hits.",
            _table(
                [
                    "flask-quota algorithm",
                    "tiers",
                    "flask-quota (allowed / denied / denied, no cache)",
                    "Flask-Limiter strategy",
                    "Flask-Limiter (no headers)",
                    "Flask-Limiter (headers)",
                ],
                rows,
            ),
            "Counted at the client: `redis.connection.AbstractConnection.send_packed_command` "
            "(one call per command or per pipeline, i.e. per round trip) and `read_response` "
            "(one call per reply) are wrapped for the duration of the counted requests; every "
            "connection of every pool in the process goes through them. Replies equal round "
            f"trips in every case: {'yes' if replies_match else 'NO'}.",
        ]
    )


def _latency_section(r: Results) -> str:
    lat = r.latency
    raw = _median(r, RAW)

    def row(label: str, key: str, fl_key: str | None = None) -> list[str]:
        x = lat.get(key)
        if x is None:
            return [label, "-", "-", "-", "-", "-"]
        fl_added = _added(r, fl_key) if fl_key else None
        quartiles = f"{x.q1_us:.1f} .. {x.q3_us:.1f}"
        on_redis = x.added_us is not None and ("redis" in key or key.startswith("floor/"))
        return [
            label,
            _us(x.median_us),
            _us(x.added_us),
            quartiles,
            _x(_ratio(x.added_us, raw)) if on_redis else "-",
            _x(_ratio(fl_added, x.added_us)) if fl_key else "-",
        ]

    rows = [row("bare Flask app (baseline)", "bare")]
    for tiers in (1, 2, 3):
        rows.append(row(f"flask-quota memory, token_bucket, {tiers} tier(s)", f"q/mem/tb/{tiers}"))
    for algorithm, short in SHORT.items():
        if short != "tb":
            rows.append(row(f"flask-quota memory, {algorithm}, 3 tiers", f"q/mem/{short}/3"))
    for strategy in dict.fromkeys(LIMITER_STRATEGY.values()):
        for h in (0, 1):
            rows.append(
                row(
                    f"Flask-Limiter memory, {strategy}, 3 limits{', headers' if h else ''}",
                    f"fl/mem/{strategy}/3/h{h}",
                )
            )
    for tiers in (1, 2, 3):
        fl_key = f"fl/redis/fixed-window/{tiers}/h0"
        rows.append(
            row(f"flask-quota Redis, token_bucket, {tiers} tier(s)", f"q/redis/tb/{tiers}", fl_key)
        )
    for algorithm, short in SHORT.items():
        if short != "tb":
            rows.append(
                row(
                    f"flask-quota Redis, {algorithm}, 3 tiers",
                    f"q/redis/{short}/3",
                    f"fl/redis/{LIMITER_STRATEGY[algorithm]}/3/h0",
                )
            )
    rows.append(
        row(
            "flask-quota Redis, token_bucket, 3 tiers, QUOTA_HEADERS=none",
            "q/redis/tb/3/noheaders",
            "fl/redis/fixed-window/3/h0",
        )
    )
    for tiers in (1, 2):
        rows.append(
            row(
                f"Flask-Limiter Redis, fixed-window, {tiers} limit(s)",
                f"fl/redis/fixed-window/{tiers}/h0",
            )
        )
    for strategy in dict.fromkeys(LIMITER_STRATEGY.values()):
        for h in (0, 1):
            rows.append(
                row(
                    f"Flask-Limiter Redis, {strategy}, 3 limits{', headers' if h else ''}",
                    f"fl/redis/{strategy}/3/h{h}",
                )
            )
    rows.append(
        row("raw EVALSHA `return 1` (redis-py, our client settings)", "raw/evalsha-return1")
    )
    rows.append(row("raw EVALSHA of flask-quota's script, 3 keys, tight loop (x floor)", RAW))
    rows.append(row("flask-quota `RedisStorage.decide`, 3 checks, no Flask", "q/storage/tb/3"))
    rows.append(
        row(
            "floor: bare app + one EVALSHA (GET + SET PX on 3 keys) in before_request",
            "floor/in-request/decide3",
        )
    )

    pair_rows = []
    for algorithm, strategy, ours, h0, ratio0, ratio1 in _pairings(r):
        h1 = _added(r, f"fl/redis/{strategy}/3/h1")
        pair_rows.append([algorithm, _us(ours), strategy, _us(h0), _x(ratio0), _us(h1), _x(ratio1)])
    rounds, batch = r.latency_rounds
    return "\n\n".join(
        [
            "## 2. Added latency per request, in-process",
            f"Direct WSGI calls of `GET /res` (no sockets, no test client), {rounds} rounds; "
            f"each round times a batch of {batch} requests of every case, in a shuffled order. "
            "Callers rotate over 1,000 identities (1,000 IPs, 1,000 `X-User`s), the same for "
            "every case. *added* is the median over rounds of (case - bare app) in the same "
            "round; the quartiles are those of that per-round difference (or of the value, for "
            "calls without Flask). *x floor* divides *added* by the raw EVALSHA of the same "
            "script in a tight loop (Redis rows); *FL / ours* divides Flask-Limiter's added "
            "latency (same limits, no headers) by ours. The last row is the floor: a bare app "
            "whose `before_request` hook makes one EVALSHA of a script doing a `GET` and a "
            "`SET PX` on each of the caller's three keys: the least any one-round-trip "
            "limiter can add, and usually well above the tight-loop number (see README).",
            _table(
                [
                    "case",
                    "per request (us)",
                    "added (us)",
                    "quartiles (us)",
                    "x floor",
                    "FL / ours",
                ],
                rows,
            ),
            "Side by side on Redis, three tiers (flask-quota sends `X-RateLimit-*` and "
            "`RateLimit*` headers in every row):",
            _table(
                [
                    "flask-quota",
                    "added (us)",
                    "Flask-Limiter",
                    "added, no headers (us)",
                    "ratio",
                    "added, headers (us)",
                    "ratio",
                ],
                pair_rows,
            ),
        ]
    )


def _throughput_section(r: Results) -> str:
    bare = r.throughput["bare"]
    ours = r.throughput["flask-quota"]
    rows = []
    for name, t in r.throughput.items():
        runs = ", ".join(f"{x.rps:.0f}" for x in t.runs)
        rows.append(
            [
                name,
                f"{t.rps:.0f}",
                runs,
                str(t.errors),
                _x(t.ratio(bare)),
                _x(ours.ratio(t)),
                f"{t.cpu('gunicorn'):.0f}",
                f"{t.cpu('redis-server'):.0f}",
                f"{t.cpu('load generator'):.0f}",
            ]
        )
    rounds, seconds = r.throughput_rounds
    return "\n\n".join(
        [
            "## 3. Throughput under gunicorn",
            f"gunicorn, 4 sync workers per app, all apps up at once on loopback; each of "
            f"{rounds} round(s) loads every app in turn (shuffled) for {seconds:.0f} s with "
            f"{r.load_generator}, 16 connections, `X-User` rotating over 10,000 users. Three "
            "tiers/limits on the same redis-server; flask-quota uses token_bucket, "
            "Flask-Limiter its default fixed-window. Requests/s is the median of the rounds; "
            "ratios are medians of the per-round ratios (servers loaded in the same round "
            "share that stretch of machine noise); *errors* counts non-2xx answers and "
            "socket errors (must be 0). The CPU columns are user + system CPU time per "
            "request (median of the rounds) of the app's gunicorn master and workers, of the "
            "redis-server and of the load generator, from `/proc/<pid>/stat` and "
            "`getrusage`; the machine has 2 cores, so they bound the throughput.",
            _table(
                [
                    "server",
                    "req/s",
                    "per round",
                    "errors",
                    "ratio to bare",
                    "flask-quota / it",
                    "CPU us/req: gunicorn",
                    "redis-server",
                    "wrk",
                ],
                rows,
            ),
        ]
    )


def _footprint_section(r: Results) -> str:
    parts = ["## 4. Memory per tracked key"]
    if r.redis_footprint:
        rows = [
            [
                f.library,
                f.algorithm,
                f"{f.keys:,}",
                f"{f.keys_per_caller:g}",
                f"{f.memory_usage:.1f}",
                f"{f.used_memory:.1f}",
            ]
            for f in r.redis_footprint
        ]
        parts += [
            "Redis: one request from each of N callers with three tiers/limits at `10/hour` "
            "(so no key expires during the count), then `MEMORY USAGE key SAMPLES 0` on "
            "every key the app created, and `used_memory` growth per key (includes the "
            "keyspace and expiry tables). Logs (sliding_window_log, moving-window) hold one "
            "entry per request in the window, so they grow with traffic; these are the "
            "one-request sizes.",
            _table(
                [
                    "library",
                    "algorithm",
                    "keys",
                    "keys per caller",
                    "MEMORY USAGE (bytes/key)",
                    "used_memory (bytes/key)",
                ],
                rows,
            ),
        ]
    if r.process_footprint:
        rows = [
            [
                f.algorithm,
                f"{f.keys:,}",
                f"{f.traced_per_key:.0f}",
                f"{f.rss_per_key:.0f}",
                f"{f.keys_after_expiry}",
                f"{f.traced_after_expiry / 1e6:.2f}",
                f"{f.rss_after_expiry / 1e6:.1f}",
                f"{f.seconds:.1f}",
                f"{f.gc_seconds * 1000:.0f}",
            ]
            for f in r.process_footprint
        ]
        parts += [
            "Memory backend (`MemoryStorage`, child process, frozen test clock): three keys "
            "per caller as the app builds them; Python heap per key by `tracemalloc`, RSS "
            "growth per key from a second run without tracemalloc. Then the clock jumps two "
            "hours, the storage sweeps, and what is still held is shown. The last column is "
            "one full `gc.collect()` with the keys held (the garbage collector walks the "
            "storage's dict and expiry sets).",
            _table(
                [
                    "algorithm",
                    "keys",
                    "heap (bytes/key)",
                    "RSS (bytes/key)",
                    "keys after expiry",
                    "heap still held (MB)",
                    "RSS still held (MB)",
                    "fill time (s)",
                    "full gc.collect() (ms)",
                ],
                rows,
            ),
        ]
    return "\n\n".join(parts)


def _growth_section(r: Results) -> str:
    parts = ["## 5. Growth"]
    if r.latency:
        rows = []
        for tiers in (1, 2, 3):
            rows.append(
                [
                    str(tiers),
                    _us(_added(r, f"q/mem/tb/{tiers}")),
                    _us(_added(r, f"q/redis/tb/{tiers}")),
                    _us(_added(r, f"fl/redis/fixed-window/{tiers}/h0")),
                ]
            )
        parts += [
            "With the number of tiers (from section 2, added us per request):",
            _table(
                [
                    "tiers / limits",
                    "flask-quota memory",
                    "flask-quota Redis",
                    "Flask-Limiter Redis (fixed-window)",
                ],
                rows,
            ),
        ]
    if r.growth:
        populations = sorted({g.population for g in r.growth})
        by = {(g.backend, g.population): g.added_us for g in r.growth}
        rows = []
        for p in populations:
            rows.append(
                [
                    f"{p:,}",
                    _us(by.get(("memory", p))),
                    _x(_ratio(by.get(("memory", p)), by.get(("memory", populations[0])))),
                    _us(by.get(("redis", p))),
                    _x(_ratio(by.get(("redis", p)), by.get(("redis", populations[0])))),
                ]
            )
        rounds, batch = r.growth_rounds
        parts += [
            "With the number of active identities: every caller of the population has state "
            "before timing starts (token bucket at `100/day`, so none expires); requests pick "
            f"callers uniformly at random; {rounds} interleaved rounds of {batch} requests; "
            "added us per request over the bare app.",
            _table(
                [
                    "active identities",
                    "memory added (us)",
                    "vs smallest",
                    "Redis added (us)",
                    "vs smallest",
                ],
                rows,
            ),
        ]
    return "\n\n".join(parts)


def _compare_section(r: Results) -> str:
    c = r.compare
    assert c is not None
    rows = [
        [
            label,
            _us(c.median_us.get(key)),
            _us(c.added_us.get(key)),
            f"{c.quartiles[key][0]:.1f} .. {c.quartiles[key][1]:.1f}",
        ]
        for key, label in LABELS.items()
        if key in c.median_us
    ]
    ratios = [[what, _x(ratio), goal] for what, ratio, goal in main_ratios(c)]
    if r.throughput:
        bare, ours = r.throughput["bare"], r.throughput["flask-quota"]
        ratios.append(["gunicorn throughput, Redis: flask-quota / bare (section 3)",
                       _x(ours.ratio(bare)), ">= 0.7"])  # fmt: skip
        floor = r.throughput.get("floor")
        if floor is not None:
            ratios.append(["gunicorn throughput, Redis: floor / bare (section 3)",
                           _x(floor.ratio(bare)), "-"])  # fmt: skip
            ratios.append(["gunicorn throughput, Redis: flask-quota / floor (section 3)",
                           _x(ours.ratio(floor)), "-"])  # fmt: skip
    rounds, batch = r.compare_rounds
    return "\n\n".join(
        [
            "## 6. Side by side through the Flask test client (issue 13)",
            f"Every request is `app.test_client().get('/res')`; {rounds} interleaved rounds of "
            f"{batch} requests of every case; three tiers/limits at `1000000/hour`, 1,000 "
            "rotating callers, one redis-server. *added* is the median over rounds of "
            "(case - bare app) in the same round, with its quartiles. The floor makes one "
            "`EVALSHA` of a script doing a `GET` and a `SET PX` on each of the caller's three "
            "keys, with flask-quota's client settings, from a bare app's `before_request`.",
            _table(["case", "per request (us)", "added (us)", "quartiles of added (us)"], rows),
            "Ratios of *added* latency, all from this one run:",
            _table(["ratio", "measured", "goal"], ratios),
        ]
    )


def render(r: Results) -> str:
    m = r.machine
    target_rows = [
        [t.number, t.text, t.measured, {True: "met", False: "**missed**", None: "-"}[t.met]]
        for t in targets(r)
    ]
    parts = [
        "# flask-quota benchmark results",
        f"Measured {m['date']} with `{r.command}` "
        f"({'quick smoke run' if r.quick else 'full run'}, {r.seconds:.0f} s). "
        "Every number below comes from this one run: both libraries, the bare app and the "
        "raw Redis calls were measured side by side against the same redis-server.",
        _table(["machine", ""], [[k, v] for k, v in m.items()]),
        "## Targets",
        _table(["#", "target", "measured", ""], target_rows),
    ]
    if r.roundtrips:
        parts.append(_roundtrip_section(r))
    if r.latency:
        parts.append(_latency_section(r))
    if r.throughput:
        parts.append(_throughput_section(r))
    if r.redis_footprint or r.process_footprint:
        parts.append(_footprint_section(r))
    if r.latency or r.growth:
        parts.append(_growth_section(r))
    if r.compare is not None:
        parts.append(_compare_section(r))
    parts.append(
        "Notes: the machine is shared and noisy, so absolute numbers move between runs; "
        "the ratios, taken within one run and (for latency) within one round, are what to "
        "compare. See `bench/README.md` for the method and the profiling notes."
    )
    return "\n\n".join(parts) + "\n"
