"""The o200k_base encoding built from the vocabulary shipped in the package."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import textwrap
import threading
from importlib import resources
from pathlib import Path

import pytest
import tiktoken
import tiktoken_ext.openai_public  # type: ignore[import-untyped]

from threadline import ThreadlineError
from threadline.counting import TokenizerDataError, _encoding, o200k_base_encoding


def _shipped_vocabulary() -> bytes:
    return (
        resources.files("threadline.counting") / "_data" / "o200k_base.tiktoken.gz"
    ).read_bytes()


@pytest.mark.parametrize(
    ("text", "ids"),
    [
        ("hello world", [24912, 2375]),
        ("Hello, world!", [13225, 11, 2375, 0]),
        ("tiktoken is great!", [83, 8251, 2488, 382, 2212, 0]),
        ("  indented\n\tcode()", [220, 1383, 23537, 198, 86873, 416]),
        ("", []),
    ],
)
def test_known_strings_give_o200k_base_token_ids(text: str, ids: list[int]) -> None:
    assert o200k_base_encoding().encode_ordinary(text) == ids


def test_special_tokens_are_o200k_bases() -> None:
    encoding = o200k_base_encoding()
    assert encoding.encode("<|endoftext|>", allowed_special="all") == [199999]
    assert encoding.encode("<|endofprompt|>", allowed_special="all") == [200018]
    # As ordinary text they are just characters, never the control token.
    assert 199999 not in encoding.encode_ordinary("<|endoftext|>")
    assert encoding.name == "o200k_base"
    assert encoding.max_token_value == 200018


def test_encoding_is_the_one_tiktoken_defines_for_o200k_base(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Pattern, special tokens and ranks equal tiktoken's own o200k_base definition.

    tiktoken's definition would download the vocabulary; here its loader is
    handed the shipped file instead, so the comparison runs offline.
    """
    shipped = gzip.decompress(_shipped_vocabulary())

    def load_shipped(url: str, expected_hash: str | None = None) -> dict[bytes, int]:
        assert expected_hash == _encoding.O200K_BASE_SHA256
        return _encoding._parse_ranks(shipped)

    monkeypatch.setattr(tiktoken_ext.openai_public, "load_tiktoken_bpe", load_shipped)
    reference = tiktoken_ext.openai_public.o200k_base()
    ours = o200k_base_encoding()

    assert ours._pat_str == reference["pat_str"]
    assert ours._special_tokens == reference["special_tokens"]
    assert ours._mergeable_ranks == reference["mergeable_ranks"]
    assert len(ours._mergeable_ranks) == 199_998


def test_repeated_calls_return_one_encoding() -> None:
    assert o200k_base_encoding() is o200k_base_encoding()


def test_concurrent_first_loads_build_the_encoding_once(monkeypatch: pytest.MonkeyPatch) -> None:
    builds: list[int] = []
    real_build = _encoding.build_o200k_base

    def counting_build(compressed: bytes) -> tiktoken.Encoding:
        builds.append(1)
        return real_build(compressed)

    monkeypatch.setattr(_encoding, "_encoding", None)
    monkeypatch.setattr(_encoding, "build_o200k_base", counting_build)
    start = threading.Barrier(8)
    results: list[tiktoken.Encoding] = []

    def first_use() -> None:
        start.wait()
        results.append(o200k_base_encoding())

    threads = [threading.Thread(target=first_use) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(builds) == 1
    assert len(results) == 8
    assert all(result is results[0] for result in results)


def test_a_file_that_is_not_gzip_is_reported_as_damaged() -> None:
    with pytest.raises(TokenizerDataError, match="damaged: it is not a readable gzip"):
        _encoding.build_o200k_base(b"IQ== 0\nIg== 1\n")


def test_a_truncated_file_is_reported_as_damaged() -> None:
    truncated = _shipped_vocabulary()[:100_000]
    with pytest.raises(TokenizerDataError, match="damaged"):
        _encoding.build_o200k_base(truncated)


def test_a_changed_vocabulary_fails_the_hash_check() -> None:
    contents = gzip.decompress(_shipped_vocabulary())
    tampered = gzip.compress(contents.replace(b"IQ== 0", b"IQ== 7", 1))
    with pytest.raises(TokenizerDataError, match=r"sha256 is [0-9a-f]{64}, expected 446a"):
        _encoding.build_o200k_base(tampered)


def test_a_missing_file_says_to_reinstall(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_encoding, "_encoding", None)
    monkeypatch.setattr(_encoding, "_VOCABULARY_FILE", "no-such-vocabulary.tiktoken.gz")
    with pytest.raises(TokenizerDataError, match=r"missing.*reinstall threadline"):
        o200k_base_encoding()
    # A failed load is not remembered as a success.
    assert _encoding._encoding is None


def test_the_error_is_a_threadline_error() -> None:
    assert issubclass(TokenizerDataError, ThreadlineError)


_OFFLINE_SCRIPT = textwrap.dedent(
    """
    import os
    import socket
    import sys

    def refuse(*args, **kwargs):
        raise OSError("network access attempted during counting")

    socket.socket.connect = refuse
    socket.socket.connect_ex = refuse
    socket.create_connection = refuse
    socket.getaddrinfo = refuse

    from threadline import Message
    from threadline.counting import BuiltinTokenCounter, o200k_base_encoding

    count = BuiltinTokenCounter().count([Message.user("hello world")])
    ids = o200k_base_encoding().encode_ordinary("hello world")
    print(count, ids, sorted(os.listdir(os.environ["TIKTOKEN_CACHE_DIR"])))
    """
)


def test_counting_works_offline_with_an_empty_tiktoken_cache(tmp_path: Path) -> None:
    """A fresh process, with the network refused and an empty cache, still counts."""
    cache_dir = tmp_path / "tiktoken-cache"
    cache_dir.mkdir()
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(cache_dir), "DATA_GYM_CACHE_DIR": str(cache_dir)}
    completed = subprocess.run(
        [sys.executable, "-c", _OFFLINE_SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "9 [24912, 2375] []"
    assert list(cache_dir.iterdir()) == []
