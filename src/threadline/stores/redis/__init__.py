"""``RedisStore``: conversations in Redis, shared by many processes and machines.

Needs the ``redis`` extra (redis-py)::

    pip install 'threadline[redis]'

Where it lives: the store in ``_store``; the key layout and the Lua scripts
that make each call one atomic step in ``_scripts``; sending the calls of
concurrent tasks to the server together in ``_calls``.
"""

from threadline._public import publish
from threadline.stores.redis._store import SCHEMA_VERSION, RedisStore

__all__ = ["SCHEMA_VERSION", "RedisStore"]

publish(globals(), __all__, __name__)
