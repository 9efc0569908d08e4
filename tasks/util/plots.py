"""Pictures: a font with Chinese glyphs for matplotlib and word clouds, and the figure helpers the
profile, evaluate and embed stages share. No I/O beyond writing the PNG asked for."""

from __future__ import annotations

import base64
from functools import lru_cache
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from tasks.errors import DataError  # noqa: E402

# families with Chinese glyphs, most wanted first (Linux, macOS, Windows)
CJK_FONTS = (
    "Noto Sans CJK SC",
    "Noto Sans SC",
    "Source Han Sans SC",
    "WenQuanYi Micro Hei",
    "WenQuanYi Zen Hei",
    "Droid Sans Fallback",
    "SimHei",
    "Microsoft YaHei",
    "PingFang SC",
    "Heiti SC",
    "AR PL UMing CN",
)
PROBE = "中文字体测试酒店服务"
INSTALL_HINT = (
    "install one (Debian/Ubuntu: `apt-get install fonts-wqy-microhei`; `make install` does this as "
    "root) "
    "or name a .ttf/.ttc/.otf file with `--set profile.font=/path/to/font`"
)


def has_glyphs(font_path: str | Path, text: str) -> bool:
    """Whether the font file maps every non-space character of `text` to a glyph (no tofu boxes)."""
    from matplotlib.ft2font import FT2Font

    font = FT2Font(str(font_path))
    return all(font.get_char_index(ord(c)) != 0 for c in set(text) if not c.isspace())


@lru_cache(maxsize=4)
def cjk_font(explicit: str | None = None) -> str | None:
    """Path of a font with Chinese glyphs: `explicit` when given, else an installed one (the font
    cache is refreshed from the system's font folders once, so a font installed after matplotlib's
    cache still counts)."""
    from matplotlib import font_manager

    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise DataError(f"profile.font: no such font file: {path}")
        if not has_glyphs(path, PROBE):
            raise DataError(
                f"profile.font: {path} has no glyphs for Chinese characters; {INSTALL_HINT}"
            )
        return str(path)

    def find() -> str | None:
        by_name = {f.name: f.fname for f in font_manager.fontManager.ttflist}
        for name in CJK_FONTS:
            if name in by_name and has_glyphs(by_name[name], PROBE):
                return by_name[name]
        return None

    found = find()
    if found is None:
        for path in font_manager.findSystemFonts():
            if any(
                k in Path(path).name.lower()
                for k in ("cjk", "wqy", "han", "hei", "droid", "song", "ming")
            ):
                try:
                    font_manager.fontManager.addfont(path)
                except (OSError, RuntimeError):
                    continue
        found = find()
    return found


def require_cjk_font(explicit: str | None = None, what: str = "profile") -> str:
    """A CJK font path, or one clear error (never a figure of empty boxes)."""
    path = cjk_font(explicit)
    if path is None:
        raise DataError(
            f"{what}: no font with Chinese glyphs found (looked for {', '.join(CJK_FONTS[:5])}, "
            "...); "
            f"{INSTALL_HINT}"
        )
    return path


def use_font(path: str) -> None:
    """Make matplotlib draw text with this font first."""
    from matplotlib import font_manager

    font_manager.fontManager.addfont(path)
    name = font_manager.FontProperties(fname=path).get_name()
    plt.rcParams["font.sans-serif"] = [
        name,
        *[f for f in plt.rcParams["font.sans-serif"] if f != name],
    ]
    plt.rcParams["font.family"] = "sans-serif"
    plt.rcParams["axes.unicode_minus"] = False  # CJK fonts often lack U+2212


def subplots(*args, **kwargs):
    """`plt.subplots` without pyplot's global figure registry: a figure of its own, safe to draw in
    any thread, freed with its last reference."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=kwargs.pop("figsize", None))
    return fig, fig.subplots(*args, **kwargs)


def save(fig, path: Path, dpi: int = 110) -> Path:
    """Write a figure (from `subplots`) as PNG."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    return path


def data_uri(path: Path) -> str:
    """A PNG as a data: URI, so an HTML report is one self-contained file."""
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode("ascii")
