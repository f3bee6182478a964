"""The deprecation helpers of ``minisgl_core.api``: an old name keeps working, with a warning naming
its replacement and removal version, for exactly one minor version."""

from __future__ import annotations

import warnings

import pytest


def test_deprecated_function_and_class_warn_and_still_work() -> None:
    from minisgl_core.api import MinisglDeprecationWarning, deprecated

    @deprecated(since="1.0", use="new_helper", current="1.0")
    def old_helper(x: int) -> int:
        return x + 1

    @deprecated(since="1.0", current="1.0")
    class OldBase:
        def __init__(self, value: int) -> None:
            self.value = value

    with pytest.warns(
        MinisglDeprecationWarning,
        match=r"old_helper is deprecated since minisgl API 1.0 .* 1.1; use new_helper",
    ):
        assert old_helper(1) == 2
    with pytest.warns(MinisglDeprecationWarning, match="OldBase"):
        assert OldBase(3).value == 3
    with pytest.warns(MinisglDeprecationWarning, match="subclassing"):
        type("Sub", (OldBase,), {})


def test_renamed_module_attribute() -> None:
    from minisgl_core.api import MinisglDeprecationWarning, renamed

    namespace = {"__name__": "fake_api", "NewName": object()}
    getattr_ = renamed({"OldName": "NewName"}, namespace, since="1.0", current="1.0")
    with pytest.warns(MinisglDeprecationWarning, match="fake_api.OldName .* use fake_api.NewName"):
        assert getattr_("OldName") is namespace["NewName"]
    with pytest.raises(AttributeError, match="Other"):
        getattr_("Other")


def test_renamed_attribute_reads_and_writes_the_new_one() -> None:
    from minisgl_core.api import MinisglDeprecationWarning, renamed_attribute

    class Spec:
        old = renamed_attribute("new", since="1.0", current="1.0")

        def __init__(self) -> None:
            self.new = 1

    spec = Spec()
    with warnings.catch_warnings():
        warnings.simplefilter("error", MinisglDeprecationWarning)
        assert spec.new == 1  # the new name never warns
    with pytest.warns(MinisglDeprecationWarning, match="Spec.old"):
        spec.old = 5
    assert spec.new == 5


def test_aliases_must_go_one_minor_version_later() -> None:
    from minisgl_core.api import deprecated, renamed

    with pytest.raises(RuntimeError, match="must be removed in 1.1"):
        renamed({"Old": "New"}, {"__name__": "m", "New": 1}, since="1.0", current="1.1")
    with pytest.raises(RuntimeError, match="delete the alias"):
        deprecated(since="1.0", current="2.0")(lambda: None)
