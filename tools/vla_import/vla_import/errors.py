"""The one error an import ends with: a single line naming file, key, expected and found."""


class ImportRefused(Exception):
    """Raised for anything the importer cannot turn into a correct bundle."""

    def __init__(self, where: str, what: str):
        super().__init__(f"{where}: {what}")
        self.where = where
        self.what = what


def expect(condition: bool, where: str, what: str) -> None:
    if not condition:
        raise ImportRefused(where, what)
