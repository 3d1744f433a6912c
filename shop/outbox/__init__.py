"""The transactional outbox: domain events and durable scheduled commands are rows written in
the same commit as the state change that makes them true; Redis only hears about them after
that commit, and the relay re-announces anything Redis lost."""

from .uow import transaction  # noqa: F401
from .writer import after_commit, schedule_command, write_events  # noqa: F401
