"""The operations blueprint (/healthz, /metrics), apart from the package so that the routes that
register on it and the package that imports them never import each other."""

from flask import Blueprint

bp = Blueprint("ops", __name__)
