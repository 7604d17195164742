"""What counts as an identifier: file names without a directory (a directory listing's tox.ini,
CHANGELOG.rst) and exception class names (ValueError, FieldInstanceResolutionError) too, and prose
with a dot is none."""

from __future__ import annotations

from proxy.identifiers import find_identifiers, rank_identifiers

LISTING = "AUTHORS.rst\nCHANGELOG.rst\nMANIFEST.in\nREADME.rst\ndocs\nsetup.cfg\nsetup.py\nsrc\ntests\ntox.ini\n"
SOURCE = '''class FieldInstanceResolutionError(MarshmallowError, TypeError):
    """Raised when schema to instantiate is neither a Schema class nor an instance."""

def resolve(value):
    if value < 0:
        raise ValueError("negative")
    raise OverflowError(value)
'''


def test_a_directory_listings_file_names_are_identifiers() -> None:
    found = find_identifiers(LISTING)
    for name in ("AUTHORS.rst", "CHANGELOG.rst", "MANIFEST.in", "README.rst", "setup.cfg", "setup.py", "tox.ini"):
        assert name in found, name
    assert "docs" not in found and "tests" not in found


def test_exception_class_names_are_identifiers() -> None:
    found = find_identifiers(SOURCE)
    for name in ("FieldInstanceResolutionError", "MarshmallowError", "TypeError", "ValueError", "OverflowError"):
        assert name in found, name


def test_prose_with_dots_and_a_paths_tail_are_no_file_names() -> None:
    found = find_identifiers("i.e. this, e.g. that, Python 3.12, see src/marshmallow/fields.py.")
    assert found == ["src/marshmallow/fields.py"]


def test_exception_names_rank_with_paths_above_plain_tokens() -> None:
    ranked = rank_identifiers(["HAT001", "ValueError"])
    assert ranked[0] == "ValueError"


def test_a_line_that_only_names_an_exception_is_no_error_line() -> None:
    from proxy.identifiers import find_error_lines

    text = "Identifiers:\n- PostingError\n- LED-7112\nledger.errors.PostingError: unbalanced posting\n"
    assert find_error_lines(text) == ["ledger.errors.PostingError: unbalanced posting"]
