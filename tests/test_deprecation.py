"""The deprecation helpers of ``minisgl_core.api``: an old name keeps working, with a warning naming
its replacement and removal version, for exactly one minor version."""

from __future__ import annotations

import sys
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


def test_moved_module_forwards_names_and_submodules_warning_once_per_importer() -> None:
    """A module kept by ``moved_module`` serves the new module's names and submodules (as
    ``minisgl_core.api.layers`` served ``minisgl_core.layers`` through API 2.0; here a module made
    for the test, since 2.1 removed that one)."""
    import types

    import minisgl_core.layers
    import minisgl_core.layers.rotary
    from minisgl_core.api import MinisglDeprecationWarning
    from minisgl_core.api.deprecation import moved_module

    old = types.ModuleType("minisgl_test_moved_layers")
    # (its version pinned: the alias would have to go at 2.2, which the API has passed)
    old.__getattr__ = moved_module(
        old.__dict__, "minisgl_core.layers", since="2.1", submodules=("rotary",), current="2.1"
    )
    sys.modules[old.__name__] = old
    try:
        with pytest.warns(MinisglDeprecationWarning) as caught:
            from minisgl_test_moved_layers import RMSNorm
        assert RMSNorm is minisgl_core.layers.RMSNorm
        (message,) = [str(w.message) for w in caught]
        # "<importing module> (<its distribution, when it has one>) imports ..."
        assert message.startswith(f"{__name__} ")
        assert "imports RMSNorm from minisgl_test_moved_layers, which moved in minisgl API 2.1" in message
        assert message.endswith("use `from minisgl_core.layers import RMSNorm` instead")
        assert caught[0].filename == __file__  # points at the importing line

        with warnings.catch_warnings():
            warnings.simplefilter("error", MinisglDeprecationWarning)
            from minisgl_test_moved_layers import RMSNorm as again  # this module was told already

        assert again is RMSNorm

        with pytest.warns(
            MinisglDeprecationWarning, match=r"use `from minisgl_core\.layers\.rotary import get_rope`"
        ):
            from minisgl_test_moved_layers.rotary import get_rope
        assert get_rope is minisgl_core.layers.rotary.get_rope

        with pytest.raises(ImportError, match="no_such_name"):
            from minisgl_test_moved_layers import no_such_name  # noqa: F401
        with pytest.raises(ModuleNotFoundError):
            import minisgl_test_moved_layers.no_such_module  # noqa: F401
    finally:
        sys.modules.pop(old.__name__, None)
        sys.modules.pop(f"{old.__name__}.rotary", None)


def test_the_1x_home_of_the_layers_is_gone_in_2_1() -> None:
    with pytest.raises(ModuleNotFoundError):
        import minisgl_core.api.layers  # noqa: F401


def test_moved_module_refuses_to_outlive_its_cycle() -> None:
    from minisgl_core.api.deprecation import moved_module

    namespace = {"__name__": "fake_api.old"}
    moved_module(namespace, "json", since="2.0", current="2.0")  # fine during 2.0
    with pytest.raises(
        RuntimeError, match="fake_api.old was deprecated in API 2.0 and must be removed in 2.1"
    ):
        moved_module({"__name__": "fake_api.old"}, "json", since="2.0", current="2.1")
