"""Can Qt open a window on this X display? The system libraries its xcb plugin needs.

Contract: :func:`missing_libraries` lists the shared libraries (sonames) that Qt's xcb
platform plugin needs and this system lacks: those ``ldd`` reports "not found" for the
plugin that ships in PySide6, plus ``libxcb-cursor.so.0``, which Qt 6.5 and later load at
run time (not a link dependency). :func:`debian_packages` names the Debian/Ubuntu
packages that carry them. :func:`problem` is the one line the app prints instead of
opening a window, or ``None`` when nothing is missing or the window will not use xcb
(offscreen, Wayland, no ``DISPLAY``). ``python -m app.display`` prints the packages, one
line, space-separated (empty when none are missing): ``setup.sh`` and the installer
install them. Nothing here imports Qt's GUI modules, so it runs before
``QApplication`` would abort with Qt's own message.
"""

import ctypes.util
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

RUNTIME_LIBRARIES = ("libxcb-cursor.so.0",)  # dlopen()ed by Qt >= 6.5, not linked
PACKAGE_NAMES = {"libglib-2.0.so.0": "libglib2.0-0", "libgthread-2.0.so.0": "libglib2.0-0"}
_NOT_FOUND = re.compile(r"^\s*(\S+)\s*=>\s*not found", re.MULTILINE)
_SONAME = re.compile(r"^(lib[\w+.-]*?)\.so\.(\d+)")


def xcb_plugin() -> Path | None:
    """PySide6's ``libqxcb.so``, found without importing Qt; ``None`` when absent."""
    spec = importlib.util.find_spec("PySide6")
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        plugin = Path(root) / "Qt" / "plugins" / "platforms" / "libqxcb.so"
        if plugin.is_file():
            return plugin
    return None


def _loadable(soname: str) -> bool:
    stem = _SONAME.match(soname)
    name = stem.group(1).removeprefix("lib") if stem else soname
    return ctypes.util.find_library(name) is not None


def missing_libraries(plugin: Path | None = None) -> list[str]:
    """The sonames the xcb plugin needs and the system lacks, in ``ldd``'s order."""
    plugin = plugin or xcb_plugin()
    missing: list[str] = []
    if plugin is not None and shutil.which("ldd"):
        done = subprocess.run(["ldd", str(plugin)], capture_output=True, text=True,
                              check=False)
        missing += _NOT_FOUND.findall(done.stdout)
    missing += [lib for lib in RUNTIME_LIBRARIES if not _loadable(lib)]
    return list(dict.fromkeys(missing))


def debian_package(soname: str) -> str:
    """The Debian package that carries ``soname`` (Debian's naming policy, with the few
    exceptions in :data:`PACKAGE_NAMES`): ``libxcb-icccm.so.4`` -> ``libxcb-icccm4``,
    ``libxkbcommon-x11.so.0`` -> ``libxkbcommon-x11-0``."""
    if soname in PACKAGE_NAMES:
        return PACKAGE_NAMES[soname]
    match = _SONAME.match(soname)
    if match is None:
        return soname
    base, version = match.group(1).lower(), match.group(2)
    return f"{base}-{version}" if base[-1].isdigit() else f"{base}{version}"


def debian_packages(sonames: list[str]) -> list[str]:
    return list(dict.fromkeys(debian_package(s) for s in sonames))


def uses_xcb(environ: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """Whether Qt will pick its xcb plugin: asked for by name, or an X display with no
    platform named and no Wayland session."""
    chosen = environ.get("QT_QPA_PLATFORM", "").strip()
    if chosen:
        return chosen.split(";")[0].split(":")[0] == "xcb"
    return bool(environ.get("DISPLAY")) and not environ.get("WAYLAND_DISPLAY")


def problem(environ: dict[str, str] | os._Environ[str] = os.environ) -> str | None:
    """One line saying what to install, when the window would fail to open for it."""
    if not uses_xcb(environ):
        return None
    missing = missing_libraries()
    if not missing:
        return None
    packages = " ".join(debian_packages(missing))
    return (f"ANVE cannot open its window: Qt's X11 support needs {', '.join(missing)}. "
            f"Install them (Debian/Ubuntu: sudo apt-get install {packages}) and start again.")


def main() -> int:
    print(" ".join(debian_packages(missing_libraries())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
