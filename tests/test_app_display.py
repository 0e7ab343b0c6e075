"""The check for the X11 libraries Qt's xcb plugin needs, before a window is opened."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app import display


@pytest.mark.parametrize(("soname", "package"), [
    ("libxcb-icccm.so.4", "libxcb-icccm4"),
    ("libxcb-keysyms.so.1", "libxcb-keysyms1"),
    ("libxcb-cursor.so.0", "libxcb-cursor0"),
    ("libxkbcommon-x11.so.0", "libxkbcommon-x11-0"),
    ("libX11-xcb.so.1", "libx11-xcb1"),
    ("libdbus-1.so.3", "libdbus-1-3"),
    ("libglib-2.0.so.0", "libglib2.0-0"),
])
def test_sonames_map_to_debian_packages(soname: str, package: str) -> None:
    assert display.debian_package(soname) == package


@pytest.mark.parametrize(("environ", "xcb"), [
    ({"DISPLAY": ":1"}, True),
    ({"DISPLAY": ":1", "QT_QPA_PLATFORM": "offscreen"}, False),
    ({"DISPLAY": ":1", "WAYLAND_DISPLAY": "wayland-0"}, False),
    ({"WAYLAND_DISPLAY": "wayland-0", "QT_QPA_PLATFORM": "xcb"}, True),
    ({"QT_QPA_PLATFORM": "xcb:dpi=96;wayland"}, True),
    ({}, False),
])
def test_the_check_applies_only_where_qt_would_use_xcb(environ: dict[str, str],
                                                        xcb: bool) -> None:
    assert display.uses_xcb(environ) is xcb


def test_the_problem_is_one_line_naming_the_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(display, "missing_libraries",
                        lambda: ["libxcb-icccm.so.4", "libxcb-keysyms.so.1"])
    text = display.problem({"DISPLAY": ":0"})
    assert text is not None and "\n" not in text
    assert "sudo apt-get install libxcb-icccm4 libxcb-keysyms1" in text
    assert display.problem({"DISPLAY": ":0", "QT_QPA_PLATFORM": "offscreen"}) is None
    monkeypatch.setattr(display, "missing_libraries", list)
    assert display.problem({"DISPLAY": ":0"}) is None


@pytest.mark.skipif(shutil.which("cc") is None or shutil.which("ldd") is None,
                    reason="needs a C compiler and ldd")
def test_ldd_finds_a_library_that_is_gone(tmp_path: Path) -> None:
    """A plugin linked against a library that was then removed: ldd says "not found"."""
    source = tmp_path / "x.c"
    source.write_text("int anve_gone(void) { return 1; }\n")
    gone = tmp_path / "libanvegone.so.3"
    subprocess.run(["cc", "-shared", "-fPIC", "-Wl,-soname,libanvegone.so.3", "-o", str(gone),
                    str(source)], check=True)
    (tmp_path / "libanvegone.so").symlink_to(gone.name)
    plugin = tmp_path / "libplugin.so"
    source.write_text("int anve_gone(void); int plugin(void) { return anve_gone(); }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(plugin), str(source),
                    f"-L{tmp_path}", "-lanvegone"], check=True)
    gone.unlink()
    assert "libanvegone.so.3" in display.missing_libraries(plugin)
    assert display.debian_packages(["libanvegone.so.3"]) == ["libanvegone3"]


def test_the_command_prints_the_packages_on_one_line() -> None:
    done = subprocess.run([sys.executable, "-m", "app.display"], capture_output=True,
                          text=True, check=True)
    expected = " ".join(display.debian_packages(display.missing_libraries()))
    assert done.stdout == expected + "\n"
