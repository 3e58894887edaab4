"""The simulator and the fault tests use explicit seams, not replaced methods.

The node's hot classes are compiled as mypyc *native* classes (``overlay.build``):
their methods and undeclared attributes cannot be set from outside, and
Python code cannot subclass them.  So the simulator watches a core through
its observer (``overlay.node.observer``), and the tests that change what a
core, its shell or its connections do go through ``Dispatcher.intercept``
and ``pace``, a ``Proxy`` in front of the object (``overlay.testing.proxy``),
or a collaborator passed in (a capture buffer).

Here, in the pure-Python build, every hot class is made to refuse what a
native class refuses — a method (or read-only property) set on an instance
— while a short simulation and fault-injecting tests run; and afterwards no
hot class was changed nor subclassed outside the hot modules.  In a compiled
build the native classes refuse it themselves (the guard cannot be put on
them, and need not be).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterator
from typing import Any

import pytest

import test_node_core_failed_publish
import test_sim_faults
import test_simulation
from overlay.build import BUILD, HOT_MODULES
from overlay.testing.sim.cluster import SimCluster
from overlay.testing.sim.setup import SimParams, random_config


def hot_classes() -> list[type]:
    out = []
    for name in HOT_MODULES:
        mod = importlib.import_module(name)
        out += [c for c in vars(mod).values() if inspect.isclass(c) and c.__module__ == name]
    return out


def _fixed(cls: type) -> set[str]:
    """What an instance of ``cls`` may not set: its methods and read-only properties."""
    names = set()
    for k in cls.__mro__[:-1]:  # not object's
        for name, v in vars(k).items():
            if (
                inspect.isfunction(v)
                or isinstance(v, (classmethod, staticmethod))
                or (isinstance(v, property) and v.fset is None)
            ):
                names.add(name)
    names.discard("__setattr__")
    return names


class Replaced(AssertionError):
    pass


@pytest.fixture
def guarded(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every pure-Python hot class refuses a method set on its instances
    (``Replaced``); yields what was refused.  Afterwards: no hot class's own
    attributes changed, no subclass of one outside the hot modules."""
    refused: list[str] = []
    classes = hot_classes()
    before = {c: dict(vars(c)) for c in classes}
    for cls in classes:
        if hasattr(cls, "__struct_fields__") or issubclass(cls, tuple) or "__setattr__" in vars(cls):
            continue  # msgspec Structs, NamedTuples, frozen records: fixed already
        fixed = _fixed(cls)
        base = cls.__setattr__

        def guard(self: Any, name: str, value: Any, _base: Any = base, _fixed: set[str] = fixed) -> None:
            if name in _fixed:
                what = f"{type(self).__module__}.{type(self).__qualname__}.{name}"
                refused.append(what)
                raise Replaced(f"{what} set on an instance: a native class refuses it (use a seam)")
            _base(self, name, value)

        try:
            monkeypatch.setattr(cls, "__setattr__", guard)
        except (TypeError, AttributeError):  # a compiled native class: it refuses it itself
            continue
    yield refused
    for cls in classes:
        changed = {k for k in set(vars(cls)) | set(before[cls]) if k != "__setattr__"}
        changed = {k for k in changed if vars(cls).get(k) is not before[cls].get(k)}
        assert not changed, f"{cls.__qualname__}: {sorted(changed)} replaced on the class"
        outside = [s for s in _subclasses(cls) if s.__module__ not in HOT_MODULES]
        assert not outside, f"{cls.__qualname__} subclassed outside the hot modules: {outside}"


def _subclasses(cls: type) -> list[type]:
    out = []
    for s in cls.__subclasses__():
        out += [s, *_subclasses(s)]
    return out


def test_the_guard_refuses_a_replaced_method(guarded: list[str]) -> None:
    sim = SimCluster(random_config(0), 0)
    router = sim.cores[0].router
    if BUILD.startswith("compiled"):  # the native class refuses it itself
        with pytest.raises(AttributeError, match="read-only"):
            router.match = lambda ch, msg, out: None  # type: ignore[method-assign]
        assert guarded == []
        return
    with pytest.raises(Replaced):
        router.match = lambda ch, msg, out: None  # type: ignore[method-assign]
    assert guarded == ["overlay.node.router.Router.match"]
    guarded.clear()


def test_a_simulation_watches_its_cores_through_their_observers(guarded: list[str]) -> None:
    params = SimParams(faults=False, w_admin=0.0, w_close=0.0, ops=120)
    result = SimCluster(random_config(3), 3, params).run()
    assert result.ok, result.failures[:3]
    assert not guarded


def test_fault_tests_change_cores_from_outside(guarded: list[str], monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    test_sim_faults.test_a_refused_publish_is_retried_with_its_id(monkeypatch, 2)  # a Proxy in front of a core
    test_node_core_failed_publish.test_a_publish_that_fails_in_a_run_is_its_own_failure(
        caplog
    )  # a failing capture buffer
    test_simulation.test_double_notifications_are_caught()  # a Proxy duplicating a core's Events
    assert not guarded
