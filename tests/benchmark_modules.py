"""Load a script of ``benchmarks/`` as a module, for the tests that run its code.

The benchmarks are scripts, not a package: each imports its siblings by bare
name, so their folder goes on ``sys.path``, and each is registered under its
own name in ``sys.modules`` before it runs (attrs and dataclasses look a
class's module up by name).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).parents[1] / "benchmarks"


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py``, run once and registered as ``name``."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
