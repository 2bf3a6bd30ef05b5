"""Admin UI placeholder."""
from flask import Blueprint

bp = Blueprint("admin", __name__, url_prefix="/admin")


@bp.get("/login")
def login():
    return "login"
