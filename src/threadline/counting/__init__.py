"""Token counting: the protocols, the built-in counters and the resolution chain.

See docs/counting.md for what each counter counts and why.
"""

from threadline._errors import TokenizerDataError
from threadline._public import publish
from threadline.counting._anchored import AnchoredCounter
from threadline.counting._approximate import (
    ApproximateCounter,
    estimate_content_tokens,
    estimate_message_tokens,
)
from threadline.counting._builtin import BuiltinTokenCounter
from threadline.counting._calibration import CalibratedCounter, TokenCalibration
from threadline.counting._encoding import o200k_base_encoding
from threadline.counting._projection import DefaultReplayProjection
from threadline.counting._protocol import (
    AsyncTokenCounter,
    BindableCounter,
    IncrementalTokenCounter,
    ModelTokenCounter,
    ReplayProjection,
    TokenCounter,
)
from threadline.counting._resolution import (
    default_token_counter,
    resolve_exact_token_counter,
    resolve_token_counter,
    set_default_token_counter,
)

__all__ = [
    "AnchoredCounter",
    "ApproximateCounter",
    "AsyncTokenCounter",
    "BindableCounter",
    "BuiltinTokenCounter",
    "CalibratedCounter",
    "DefaultReplayProjection",
    "IncrementalTokenCounter",
    "ModelTokenCounter",
    "ReplayProjection",
    "TokenCalibration",
    "TokenCounter",
    "TokenizerDataError",
    "default_token_counter",
    "estimate_content_tokens",
    "estimate_message_tokens",
    "o200k_base_encoding",
    "resolve_exact_token_counter",
    "resolve_token_counter",
    "set_default_token_counter",
]

publish(globals(), __all__, __name__)
