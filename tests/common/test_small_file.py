"""Small files an admin names (config, API token): never read without end, never waited on,
and a token is one word of printable ASCII."""

import os
from pathlib import Path

import pytest
from vgpu_common.small_file import SmallFileError, read_small_file, token_of


def test_only_a_regular_file_of_at_most_the_limit_is_read(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (Path("/dev/zero"), fifo):
        with pytest.raises(SmallFileError, match=r"^not a regular file$"):
            read_small_file(path, 100)
    (tmp_path / "file").write_bytes(b"x" * 101)
    with pytest.raises(SmallFileError, match=r"^larger than 100 bytes$"):
        read_small_file(tmp_path / "file", 100)
    assert read_small_file(tmp_path / "file", 101) == b"x" * 101
    with pytest.raises(FileNotFoundError):
        read_small_file(tmp_path / "missing", 100)
    with pytest.raises(IsADirectoryError):
        read_small_file(tmp_path, 100)


@pytest.mark.parametrize("data", [b"\xff\xfe", b"a\nb\n", "t\u00f6k".encode(), b"a b", b"\x00"])
def test_a_token_is_one_word_of_printable_ascii(data: bytes) -> None:
    """Before: UnicodeDecodeError tracebacks, and a token of two lines echoed in an error."""
    with pytest.raises(SmallFileError) as caught:
        token_of(data)
    assert str(caught.value) == "not a token: only printable ASCII without blanks is"


def test_tokens_as_files_hold_them() -> None:
    assert token_of(b"  s3cr-et_~x\n") == "s3cr-et_~x"
    with pytest.raises(SmallFileError, match=r"^empty$"):
        token_of(b" \n")
