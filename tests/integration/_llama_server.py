"""Start llama-cpp-python's OpenAI-compatible server, unchanged but for one load flag.

Run as ``python tests/integration/_llama_server.py --model ... --port ...``;
every argument goes to ``python -m llama_cpp.server``.

llama.cpp moves weights into "extra buffer types" for faster kernels (AMX
tiles on recent Xeons, repacked quants elsewhere). Where the kernel does not
grant AMX tile state (some VMs and sandboxes), the first decode dies with
SIGSEGV. llama.cpp's own server turns this off with ``--no-repack``;
llama-cpp-python's does not expose it, so this launcher sets the same model
parameter (``use_extra_bufts = False``) before the server loads the model. A
135M model loses nothing measurable by it.
"""

from __future__ import annotations

import llama_cpp.llama_cpp as llama_lib
from llama_cpp.server.__main__ import main

_default_model_params = llama_lib.llama_model_default_params


def _model_params_without_extra_buffers() -> llama_lib.llama_model_params:
    params = _default_model_params()
    params.use_extra_bufts = False
    return params


llama_lib.llama_model_default_params = _model_params_without_extra_buffers

if __name__ == "__main__":
    main()
