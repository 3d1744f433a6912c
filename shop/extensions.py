"""Extensions, created unbound here and bound to the app in `create_app`."""

import threading
from typing import TYPE_CHECKING, Callable, TypeVar, cast

from flask import Flask, current_app
from flask_login import LoginManager
from flask_migrate import Migrate
from flask_sqlalchemy import SQLAlchemy
from flask_wtf import CSRFProtect
from sqlalchemy import MetaData
from sqlalchemy.orm import DeclarativeBase
from werkzeug.local import LocalProxy

# Deterministic constraint names, so Alembic migrations are identical on SQLite and PostgreSQL.
NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


db = SQLAlchemy(model_class=Base)

if TYPE_CHECKING:
    # Flask-SQLAlchemy builds `db.Model` at run time from Base, so a type checker cannot see its
    # columns' constructor or its table: the models subclass `Model`, which it reads as Base.
    class Model(Base):
        __abstract__ = True
else:
    Model = db.Model
migrate = Migrate()
csrf = CSRFProtect()
login_manager = LoginManager()


T = TypeVar("T")
_per_app_lock = threading.RLock()  # re-entrant: a builder may ask for another per-app object


def per_app(name: str, build: Callable[[], T]) -> T:
    """The app's one `name`, built by `build()` on first use and kept with the app (per app, not
    per process: a test's apps never share a Redis client, a breaker or a metrics registry)."""
    ext = current_app.extensions.setdefault("backstop", {})
    value = ext.get(name)
    if value is None:
        with _per_app_lock:
            value = ext.get(name)
            if value is None:
                value = ext[name] = build()
    return value


def the_app() -> Flask:
    """The app behind `current_app`, for a thread that outlives the app context it was started in.
    Flask declares current_app as a Flask; it is a werkzeug LocalProxy, which unwraps it."""
    return cast("LocalProxy[Flask]", current_app)._get_current_object()
