"""The transactional outbox: domain events and durable scheduled commands are rows written in
the same commit as the state change that makes them true; Redis only hears about them after
that commit, and the relay re-announces anything Redis lost."""

from .writer import write_events, schedule_command, after_commit  # noqa: F401
from .uow import transaction  # noqa: F401
