"""The console's blueprint, apart from the package so that the modules that register their routes
on it and the package that imports them never import each other."""

from flask import Blueprint

bp = Blueprint("console", __name__, url_prefix="/console")
