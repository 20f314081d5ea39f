"""The exported names: ``lazyvault.errors.__all__`` is the one list of the
exception classes in the Python sources, and ``lazyvault`` re-exports it."""

from __future__ import annotations

import lazyvault as lv
import lazyvault._lazyvault as core
import lazyvault.errors as errors


def test_errors_lists_every_exception_class_of_the_core() -> None:
    classes = {
        name
        for name in core.__all__
        if isinstance(getattr(core, name), type) and issubclass(getattr(core, name), BaseException)
    }
    assert sorted(errors.__all__) == sorted(classes)


def test_the_package_exports_the_errors_once() -> None:
    assert len(lv.__all__) == len(set(lv.__all__))
    assert set(errors.__all__) <= set(lv.__all__)
    namespace: dict[str, object] = {}
    exec("from lazyvault import *", namespace)
    for name in errors.__all__:
        assert namespace[name] is getattr(core, name) is getattr(errors, name)
    assert "StoreCore" not in namespace and "StoreCore" not in lv.__all__
