"""A refusal a person reads, in either language: its case and values travel with it.

The model core speaks English (the CLI's and the Python API's line, str()); the app says the same refusal in the
visitor's language from its catalogs, under the key `<prefix>.<case>` (app/i18n.py's error_text). A subclass
lists its cases' English; tests hold the English catalog to those lines word for word.
"""
from __future__ import annotations


class Refusal(ValueError):
    PREFIX = ""
    MESSAGES: dict[str, str] = {}

    def __init__(self, case: str, **values):
        self.key, self.values = f"{self.PREFIX}.{case}", values
        super().__init__(self.MESSAGES[case].format(**values))
