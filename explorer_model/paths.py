"""Where the shipped files are: assets/ beside the package (an editable install imports from the work tree)."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "assets"
