"""Icons from ``assets/icons/*.svg``, drawn in the theme's colours.

Contract: :func:`icon` returns a ``QIcon`` of the named SVG with ``currentColor`` set
to the given colour (default: the theme's muted text), rendered sharp at 2x; results
are cached per name, colour and size. Buttons given an icon with :func:`set_icon`
follow theme changes through :func:`refresh_icons`.
"""

from functools import lru_cache

from PySide6.QtCore import QByteArray, QSize, Qt
from PySide6.QtGui import QIcon, QPainter, QPixmap
from PySide6.QtSvg import QSvgRenderer
from PySide6.QtWidgets import QAbstractButton, QWidget

from app.paths import assets_dir
from app.theme import colors


@lru_cache(maxsize=256)
def _pixmap(name: str, color: str, size: int) -> QPixmap:
    svg = (assets_dir() / "icons" / f"{name}.svg").read_text(encoding="utf-8")
    renderer = QSvgRenderer(QByteArray(svg.replace("currentColor", color).encode()))
    pixmap = QPixmap(size * 2, size * 2)
    pixmap.fill(Qt.GlobalColor.transparent)
    painter = QPainter(pixmap)
    renderer.render(painter)
    painter.end()
    pixmap.setDevicePixelRatio(2.0)
    return pixmap


def icon(name: str, color: str | None = None, size: int = 18) -> QIcon:
    return QIcon(_pixmap(name, color or colors().muted, size))


def icon_size(size: int = 18) -> QSize:
    return QSize(size, size)


def set_icon(button: QAbstractButton, name: str, role: str = "muted", size: int = 18) -> None:
    """Give a button a themed icon that :func:`refresh_icons` redraws on theme changes."""
    button.setProperty("anve_icon", name)
    button.setProperty("anve_icon_role", role)
    button.setProperty("anve_icon_size", size)
    button.setIcon(icon(name, getattr(colors(), role), size))
    button.setIconSize(icon_size(size))


def refresh_icons(root: QWidget) -> None:
    """Redraw every themed icon under ``root`` in the current theme's colours."""
    for button in root.findChildren(QAbstractButton):
        name = button.property("anve_icon")
        if name:
            role = str(button.property("anve_icon_role") or "muted")
            size = int(button.property("anve_icon_size") or 18)
            button.setIcon(icon(str(name), getattr(colors(), role), size))
