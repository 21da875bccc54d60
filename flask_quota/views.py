"""Which limits a view carries: what ``@quota.limit`` and ``@quota.exempt`` leave on a
view function, a blueprint or a class-based view, and how an endpoint's are found.

The decorators only record (``add_limit``, ``exempt``); ``resolve`` reads them for an
endpoint, once, when it first serves a request:

- a view function's own marks, or those of the function it wraps (``__wrapped__``,
  which ``functools.wraps`` sets), or, for a wrapper made without ``functools.wraps``
  (a ``(*args, **kwargs)`` function whose closure holds one marked function), that
  function's, said once;
- for a class-based view (``View.as_view``), the marks of the class, of its
  ``dispatch_request`` and, for a ``MethodView``, of each method's function: a
  method's limits apply to that method only, the class's to every one;
- else its blueprints', innermost first.

A mark added after an endpoint was resolved (a limit added to a view that served
requests already) empties every app's resolved endpoints: it applies from the next
request on.
"""

from __future__ import annotations

import inspect
import logging
import weakref
from collections.abc import Callable, MutableMapping
from dataclasses import replace
from typing import Any, TypeVar

from flask import Blueprint, Flask
from flask.views import MethodView, View

from .core.policy import LimitSpec
from .core.priority import Priority

__all__ = [
    "ANY_METHOD",
    "EXEMPT_ATTR",
    "LIMIT_ATTR",
    "Found",
    "Limits",
    "add_limit",
    "exempt",
    "limit_of",
    "limited_endpoints",
    "named",
    "priority_of",
    "resolve",
    "set_priority",
    "watch",
]

log = logging.getLogger("flask_quota")

F = TypeVar("F", bound=Callable[..., Any] | Blueprint | type)
Limits = tuple[LimitSpec, ...]  # a view's limits, the one nearest the function first
Found = tuple[bool, Limits]  # (exempt, limits) of an endpoint for one method
# What ``resolve`` answers: one ``Found`` for every method, or one per method (a
# ``MethodView`` whose methods carry marks of their own), ``ANY_METHOD`` for the rest.
Resolved = Found | dict[str, Found]
ANY_METHOD = "*"

# What the decorators leave on a view function, a blueprint or a class; read once per
# endpoint.
LIMIT_ATTR = "__quota_limit__"
EXEMPT_ATTR = "__quota_exempt__"
PRIORITY_ATTR = "__quota_priority__"  # @quota.priority: the view's class (overload)

_WRAPS_DEPTH = 3  # decorators without functools.wraps looked through, at most
_told_wraps: set[str] = set()  # endpoints whose missing functools.wraps was said
# The resolved endpoints of every app, emptied when a mark is added (see the module).
_caches: weakref.WeakSet[Any] = weakref.WeakSet()


def watch(holder: Any) -> None:
    """Call ``holder.forget_views()`` (an app's resolved endpoints) whenever a mark is
    added."""
    _caches.add(holder)


def _marked(view: Any) -> None:
    for holder in list(_caches):
        holder.forget_views()


def _check_target(view: Any, what: str) -> None:
    """A class is a view only as a ``flask.views.View``: anything else is refused now."""
    if isinstance(view, type) and not issubclass(view, View):
        raise TypeError(
            f"{what} on the class {view.__name__!r}: only flask.views.View classes (and "
            "MethodView) are views; decorate the class-based view, its methods, or the view "
            "function you register"
        )
    if not (callable(view) or isinstance(view, Blueprint)):
        raise TypeError(f"{what} takes a view function, a class-based view or a blueprint")


def exempt(view: F) -> F:
    """Mark a view (a blueprint: all its views; a class-based view or one of its methods)
    as exempt from every tier."""
    _check_target(view, "@quota.exempt")
    setattr(view, EXEMPT_ATTR, True)
    _marked(view)
    return view


def set_priority(view: F, priority: Priority) -> F:
    """Mark a view (a blueprint: all its views; a class-based view or one of its methods)
    with a priority class (``@quota.priority``)."""
    _check_target(view, "@quota.priority")
    setattr(view, PRIORITY_ATTR, priority)
    _marked(view)
    return view


def priority_of(app: Flask, endpoint: str, method: str, specs: Limits) -> Priority | None:
    """An endpoint's class for a request of ``method``: ``@quota.priority`` on its view
    (a class-based view's method, then the class), else its limits' ``priority=`` (the
    one nearest the function), else its blueprints' ``@quota.priority``, innermost
    first; None when none says."""
    view = app.view_functions.get(endpoint)
    cls = getattr(view, "view_class", None)
    targets: list[Any] = []
    if isinstance(cls, type) and issubclass(cls, View):
        targets += [getattr(cls, method.lower(), None), cls.dispatch_request, cls]
    targets.append(_carrier(view, endpoint))
    for target in targets:
        found = getattr(target, PRIORITY_ATTR, None)
        if found is not None:
            return found  # type: ignore[no-any-return]
    for spec in specs:
        if spec.priority is not None:
            return spec.priority
    name = endpoint.rpartition(".")[0]
    while name:
        found = getattr(app.blueprints.get(name), PRIORITY_ATTR, None)
        if found is not None:
            return found  # type: ignore[no-any-return]
        name = name.rpartition(".")[0]
    return None


def limit_of(view: Any) -> Limits:
    """The ``@quota.limit`` decorators recorded on a view function, a class or a blueprint,
    the one nearest the function first; empty when there is none."""
    specs: Limits = getattr(view, LIMIT_ATTR, ())
    return specs


def add_limit(view: Any, spec: LimitSpec) -> None:
    """Record one more ``@quota.limit`` on ``view``; two explicit resources must differ
    (they would be one bucket charged twice)."""
    _check_target(view, "@quota.limit")
    found = limit_of(view)
    if spec.resource is not None and any(s.resource == spec.resource for s in found):
        what = getattr(view, "name", None) or getattr(view, "__name__", repr(view))
        raise ValueError(
            f"{what} already has a @quota.limit with resource {spec.resource!r}; "
            "give each limit stacked on a view its own resource"
        )
    setattr(view, LIMIT_ATTR, (*found, spec))
    _marked(view)


def _marks(target: Any) -> Found:
    return bool(getattr(target, EXEMPT_ATTR, False)), limit_of(target)


def _carrier(view: Any, endpoint: str, depth: int = 0) -> Any:
    """The function whose marks ``view`` carries: itself, one it wraps (``__wrapped__``),
    or, under a decorator without ``functools.wraps``, the one marked function its
    ``(*args, **kwargs)`` wrapper closes over (said once per endpoint). ``view`` itself
    when none carries any."""
    seen = view
    for _ in range(16):  # functools.wraps copies the marks too: the first wins
        if getattr(seen, LIMIT_ATTR, None) or getattr(seen, EXEMPT_ATTR, False):
            return seen
        inner = getattr(seen, "__wrapped__", None)
        if inner is None:
            break
        seen = inner
    if depth >= _WRAPS_DEPTH or not _is_wrapper(seen):
        return view
    held = []
    for cell in getattr(seen, "__closure__", None) or ():
        try:
            content = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if callable(content) and not isinstance(content, type):
            held.append(_carrier(content, endpoint, depth + 1))
    marked = [f for f in held if getattr(f, LIMIT_ATTR, None) or getattr(f, EXEMPT_ATTR, False)]
    if len({id(f) for f in marked}) != 1:
        return view  # none, or several: no one of them is "the view"
    if endpoint not in _told_wraps:
        _told_wraps.add(endpoint)
        log.warning(
            "flask-quota: the view of endpoint %r is wrapped by a decorator that does not use "
            "functools.wraps; its @quota marks were found in the wrapper's closure and apply. "
            "Add @functools.wraps(view) to the decorator's wrapper. This is said once.",
            endpoint,
        )
    return marked[0]


def _is_wrapper(function: Any) -> bool:
    """A decorator's wrapper: a plain function taking ``*args`` and ``**kwargs``."""
    code = getattr(function, "__code__", None)
    if code is None:
        return False
    flags = code.co_flags
    return bool(flags & inspect.CO_VARARGS and flags & inspect.CO_VARKEYWORDS)


def resolve(app: Flask, endpoint: str) -> Resolved:
    """``(exempt, limits)`` of an endpoint, or one per method (see the module docstring):
    the view's own marks win, then its blueprints', innermost first. Static files are
    exempt: they are not the API."""
    if endpoint.rpartition(".")[2] == "static":
        return True, ()
    view = app.view_functions.get(endpoint)
    exempted, specs = _marks(_carrier(view, endpoint))
    cls = getattr(view, "view_class", None)
    per_method: dict[str, Found] = {}
    if isinstance(cls, type) and issubclass(cls, View):
        # The class's and its dispatch_request's marks apply to every method, before
        # (outside) a method's own: their buckets keep their names whatever the method.
        for target in (cls, cls.dispatch_request):
            more_exempt, more = _marks(target)
            exempted, specs = exempted or more_exempt, (*more, *specs)
        if issubclass(cls, MethodView):
            for method in cls.methods or ():
                function = getattr(cls, method.lower(), None)
                if function is None and method == "HEAD":
                    function = getattr(cls, "get", None)
                own_exempt, own = _marks(function)
                if own_exempt or own:
                    per_method[method] = (exempted or own_exempt, (*specs, *own))
    if not exempted and not specs and not per_method:
        name = endpoint.rpartition(".")[0]
        while not specs and name:  # "parent.child.view": child first, then parent
            blueprint = app.blueprints.get(name)
            if getattr(blueprint, EXEMPT_ATTR, False):
                return True, ()
            specs = limit_of(blueprint)
            name = name.rpartition(".")[0]
    common: Found = (True, ()) if exempted else (False, named(specs, endpoint))
    if not per_method:
        return common
    found = {
        method: (True, ()) if own_exempt else (False, named(own, endpoint))
        for method, (own_exempt, own) in per_method.items()
    }
    found[ANY_METHOD] = common
    return found


def for_method(resolved: Resolved, method: str) -> Found:
    """What ``resolve`` found for a request of ``method``."""
    if type(resolved) is dict:
        return resolved.get(method) or resolved[ANY_METHOD]
    return resolved  # type: ignore[return-value]


def named(specs: Limits, endpoint: str) -> Limits:
    """Stacked limits with their resources set, so each has a bucket of its own: the
    first without one (nearest the function) takes the endpoint's name, as a lone
    limit does, and the n-th is named ``ENDPOINT.n``; adding a limit above the others
    leaves their buckets' keys as they were. A name another limit of the stack gives
    itself (``resource=``) is skipped: two limits never share a bucket. A lone limit is
    left as it is."""
    if len(specs) < 2:
        return specs
    taken = {spec.resource for spec in specs if spec.resource is not None}
    out: list[LimitSpec] = []
    unnamed = 0
    for spec in specs:
        name = spec.resource
        while name is None or (spec.resource is None and name in taken):
            unnamed += 1
            name = endpoint if unnamed == 1 else f"{endpoint}.{unnamed}"
        out.append(replace(spec, resource=name, stacked=True))
    return tuple(out)


def limited_endpoints(
    app: Flask, cache: MutableMapping[str, Resolved] | None = None
) -> list[tuple[str, str, LimitSpec]]:
    """(method, resource, spec) for every limit of every limited route: the endpoint
    buckets an identity can have, for usage views and resets. A limit with
    ``per_method=False`` has one bucket, under the method ``*``."""
    found: dict[tuple[str, str], LimitSpec] = {}
    for rule in app.url_map.iter_rules():
        resolved = cache.get(rule.endpoint) if cache is not None else None
        if resolved is None:
            resolved = resolve(app, rule.endpoint)
            if cache is not None:
                cache[rule.endpoint] = resolved
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            is_exempt, specs = for_method(resolved, method)
            if is_exempt:
                continue
            for spec in specs:
                found.setdefault((spec.method_of(method), spec.resource or rule.endpoint), spec)
    return [(method, resource, spec) for (method, resource), spec in sorted(found.items())]
