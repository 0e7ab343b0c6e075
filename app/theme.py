"""Light and dark looks: a Fusion palette plus one stylesheet with colour tokens.

Contract: :func:`apply` sets the style, palette and stylesheet for ``"light"``,
``"dark"`` or ``"system"`` (the platform's colour scheme) and returns the colours in
use; :func:`colors` gives them to widgets that paint themselves (charts, draft
highlighting). The stylesheet is ``assets/theme/anve.qss`` with ``@token`` names
replaced by :class:`Colors` fields.
"""

import re
from dataclasses import asdict, dataclass
from typing import TypeVar

from PySide6.QtCore import QDir, Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QAbstractSpinBox, QApplication

from app.paths import assets_dir


@dataclass(frozen=True)
class Colors:
    name: str
    window: str
    surface: str
    sidebar: str
    text: str
    muted: str
    border: str
    accent: str
    accent_text: str
    selection: str
    user_bubble: str
    code_bg: str
    draft: str
    good: str
    warn: str
    warn_bg: str
    bad: str
    bad_bg: str
    chart_a: str
    chart_b: str
    hover: str


LIGHT = Colors(
    name="light", window="#f7f8fa", surface="#ffffff", sidebar="#eef1f5", text="#1f2328",
    muted="#6a737d", border="#d9dee5", accent="#2563eb", accent_text="#ffffff",
    selection="#dbe6fd", user_bubble="#e7efff", code_bg="#f3f5f8", draft="#c9f2dc",
    good="#15803d", warn="#b45309", warn_bg="#fff4e0", bad="#b91c1c", bad_bg="#fdecec",
    chart_a="#2563eb", chart_b="#16a34a", hover="#e3e8ef",
)
DARK = Colors(
    name="dark", window="#17191d", surface="#1f2227", sidebar="#14161a", text="#e6e8eb",
    muted="#9aa3ae", border="#30353d", accent="#5b9cff", accent_text="#0b1220",
    selection="#263a5c", user_bubble="#243350", code_bg="#121418", draft="#1f5138",
    good="#4ade80", warn="#fbbf24", warn_bg="#3a2f14", bad="#f87171", bad_bg="#3b1d1f",
    chart_a="#5b9cff", chart_b="#4ade80", hover="#2a2e35",
)
_current = LIGHT


def colors() -> Colors:
    return _current


def system_scheme() -> str:
    hints = QGuiApplication.styleHints()
    return "dark" if hints.colorScheme() == Qt.ColorScheme.Dark else "light"


def palette(c: Colors) -> QPalette:
    pal = QPalette()
    roles = {
        QPalette.ColorRole.Window: c.window, QPalette.ColorRole.WindowText: c.text,
        QPalette.ColorRole.Base: c.surface, QPalette.ColorRole.AlternateBase: c.sidebar,
        QPalette.ColorRole.Text: c.text, QPalette.ColorRole.Button: c.surface,
        QPalette.ColorRole.ButtonText: c.text, QPalette.ColorRole.Highlight: c.accent,
        QPalette.ColorRole.HighlightedText: c.accent_text, QPalette.ColorRole.ToolTipBase:
        c.surface, QPalette.ColorRole.ToolTipText: c.text, QPalette.ColorRole.PlaceholderText:
        c.muted, QPalette.ColorRole.Link: c.accent, QPalette.ColorRole.Mid: c.border,
    }
    for role, value in roles.items():
        pal.setColor(role, QColor(value))
    for role in (QPalette.ColorRole.Text, QPalette.ColorRole.WindowText,
                 QPalette.ColorRole.ButtonText):
        pal.setColor(QPalette.ColorGroup.Disabled, role, QColor(c.muted))
    return pal


def stylesheet(c: Colors) -> str:
    template = (assets_dir() / "theme" / "anve.qss").read_text(encoding="utf-8")
    values = asdict(c)
    return re.sub(r"@(\w+)", lambda m: values.get(m.group(1), m.group(0)), template)


SpinBox = TypeVar("SpinBox", bound=QAbstractSpinBox)


def pad_spin_box(box: SpinBox) -> SpinBox:
    """Indent a spin box's text (its inner line edit ignores stylesheet padding)."""
    box.lineEdit().setTextMargins(6, 0, 0, 0)
    return box


def apply(app: QApplication, scheme: str = "system") -> Colors:
    """Style the whole app; ``scheme`` is "light", "dark" or "system"."""
    global _current
    if scheme == "system":
        scheme = system_scheme()
    _current = DARK if scheme == "dark" else LIGHT
    QDir.addSearchPath("icons", str(assets_dir() / "icons"))
    app.setStyle("Fusion")
    app.setPalette(palette(_current))
    app.setStyleSheet(stylesheet(_current))
    return _current
