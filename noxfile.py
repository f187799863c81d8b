"""The sessions a contributor runs: ``nox -s tests lint typecheck docs examples bench`` (and
``bench_cache`` and ``bench_accuracy``, the benchmarks on real llama.cpp servers, and
``bench_heldout``, on other families' tokenizers)."""

from __future__ import annotations

import nox

nox.options.sessions = ["tests", "lint", "typecheck"]
nox.options.default_venv_backend = "venv"

PYTHON = "3.11"
PYTHON_PATHS = (
    "src",
    "tests",
    "benchmarks",
    "examples",
    "docs/griffe_rest_roles.py",
    "docs/site_hooks.py",
    "noxfile.py",
)


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The whole suite, integration tests included (they start a local llama.cpp server)."""
    session.install("-e", ".[test]")
    session.run("python", "-m", "pytest", *session.posargs)


@nox.session(python=PYTHON)
def unit(session: nox.Session) -> None:
    """The suite without the tests that start real servers."""
    session.install("-e", ".[test]")
    session.run("python", "-m", "pytest", "-m", "not integration", *session.posargs)


# The lowest mcp the `mcp` extra allows (the suite runs the newest). mcp 1.10 imports a
# pydantic internal that today's pydantic (2.14) no longer has, so it is tested with the
# pydantic of its day (2.11).
MCP_LOWEST = ("mcp==1.10.0", "pydantic<2.12", "pydantic-settings<2.12")


@nox.session(python=PYTHON)
def mcp_lowest(session: nox.Session) -> None:
    """The MCP tests (real FastMCP servers, stdio and HTTP, asyncio and trio) on mcp 1.10."""
    # What these tests need, not the whole test extra (which compiles llama.cpp).
    session.install("-e", ".[mcp]", "pytest>=8", "pytest-asyncio>=0.24", "trio>=0.25", *MCP_LOWEST)
    session.run(
        "python",
        "-m",
        "pytest",
        "tests/tools/test_mcp.py",
        "tests/cli/test_cli_mcp.py",
        "tests/tools/test_mcp_results.py",
        *session.posargs,
        env={"THREADLINE_REQUIRE_INTEGRATION": "1"},
    )


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff, the import contracts and the size limits, as CI runs them."""
    session.install("-e", ".[dev]")
    session.run("ruff", "check", *PYTHON_PATHS)
    session.run("ruff", "format", "--check", *PYTHON_PATHS)
    session.run("lint-imports")
    session.run("python", ".ci/check_sizes.py", "src")


@nox.session(python=PYTHON)
def typecheck(session: nox.Session) -> None:
    """mypy --strict on the library."""
    session.install("-e", ".[dev]")
    session.run("mypy", "--strict", "src")


@nox.session(python=PYTHON)
@nox.parametrize("genai_prices", ["0.2.0", "latest"])
def catalog_range(session: nox.Session, genai_prices: str) -> None:
    """The catalog index against the oldest and the newest genai-prices the range allows."""
    session.install("-e", ".[test]")
    if genai_prices != "latest":
        session.install(f"genai-prices=={genai_prices}")
    session.run(
        "python", "-m", "pytest", "tests/engine/test_catalog.py", "tests/engine/test_models.py"
    )


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """Build the site strictly, as CI does, and run every Python example in docs/ (offline)."""
    session.install("-e", ".[test,docs]")
    session.run("mkdocs", "build", "--strict", env={"NO_MKDOCS_2_WARNING": "1"})
    session.run(
        "python",
        "-m",
        "pytest",
        "tests/public/test_docs.py",
        "tests/public/test_docs_names.py",
        *session.posargs,
    )


@nox.session(python=PYTHON)
def examples(session: nox.Session) -> None:
    """Run the offline examples in examples/."""
    session.install("-e", ".")
    session.run("python", "examples/offline_scripted.py")


# Run by `nox -s bench` with the bench extra alone (tests/public/test_benchmarks.py
# checks each imports no test-only package); bench_stores also needs PostgreSQL and
# Redis installed (apt-get install postgresql redis-server), as the store tests do.
BENCHMARKS = (
    "bench_import",
    "bench_counting",
    "bench_limiting",
    "bench_request",
    "bench_conversation",
    "bench_memory",
    "bench_stores",
)


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """The benchmarks; each prints its ratios against a baseline run beside it."""
    session.install("-e", ".[bench]")
    for script in BENCHMARKS:
        session.run("python", f"benchmarks/{script}.py")


@nox.session(python=PYTHON)
def bench_accuracy(session: nox.Session) -> None:
    """How far counts are from what real llama.cpp servers report (needs the test extra's
    llama.cpp builds and SmolLM2)."""
    session.install("-e", ".[bench,test]")
    session.run("python", "benchmarks/bench_counting_accuracy.py", *session.posargs)


@nox.session(python=PYTHON)
def bench_heldout(session: nox.Session) -> None:
    """Calibration on tokenizer families it was never tuned on (needs the test extra's
    llama-cpp-python; its sdist's vocabularies are fetched once with pip)."""
    session.install("-e", ".[bench,test]")
    session.run("python", "benchmarks/bench_counting_heldout.py", *session.posargs)


@nox.session(python=PYTHON)
def bench_cache(session: nox.Session) -> None:
    """The prompt-cache benchmark on a real llama.cpp server: long (200 turns, 3 policies)."""
    session.install("-e", ".[bench,test]")
    session.run("python", "benchmarks/bench_cache.py", *session.posargs)
