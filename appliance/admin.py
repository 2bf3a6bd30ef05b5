"""The admin UI: server-rendered pages, plain JS for live parts, a session opened with the API key."""
from flask import (
    Blueprint,
    current_app,
    flash,
    redirect,
    render_template,
    request,
    url_for,
)
from werkzeug.exceptions import default_exceptions

from appliance import auth, batchwork, limits, modelfiles, queue, schema

bp = Blueprint("admin", __name__, url_prefix="/admin")


@bp.app_context_processor
def _template_globals():
    return {"csrf_token": auth.csrf_token, "logged_in": auth.logged_in}


@bp.before_request
def _csrf():
    auth.check_csrf()


@bp.errorhandler(schema.Invalid)
def _invalid(e):
    """The API's refusals (a bad query argument) as the HTML error page the UI's other errors get."""
    return default_exceptions[e.status](e.message)


@bp.route("/login", methods=("GET", "POST"))
def login():
    if request.method == "POST":
        wait = auth.login_retry_after()
        if wait is not None:
            flash(f"Too many failed logins from this address; try again in {wait} seconds.")
            return render_template("login.html"), 429, {"Retry-After": str(wait)}
        if auth.key_ok(request.form.get("api_key", "").strip()):
            auth.open_session()
            target = request.args.get("next", "")
            return redirect(target if target.startswith("/admin/") else url_for(".dashboard"))
        auth.login_failed()
        flash("That API key is not valid.")
    return render_template("login.html")


@bp.post("/logout")
def logout():
    auth.close_session()
    return redirect(url_for(".login"))


@bp.get("/")
@auth.login_required
def dashboard():
    workers = queue.live_workers()
    return render_template("dashboard.html", workers=workers, depths=queue.queue_depths(),
                           counts=queue.job_counts())


@bp.get("/jobs")
@auth.login_required
def jobs():
    state, offset, limit = schema.page(request.args)
    views, total = queue.list_jobs(state, offset, limit)
    return render_template("jobs.html", jobs=views, total=total, state=state, offset=offset, limit=limit,
                           states=("queued", "running", "finished", "failed", "cancelled"))


@bp.get("/jobs/<job_id>")
@auth.login_required
def job(job_id):
    found = queue.fetch(job_id)
    if found is None:
        flash(f"No job {job_id} (never submitted, or expired).")
        return redirect(url_for(".jobs"))
    return render_template("job.html", job=queue.describe(found), asked=queue.asked(found))


@bp.post("/jobs/<job_id>/cancel")
@auth.login_required
def cancel(job_id):
    found = queue.fetch(job_id)
    if found is not None:
        before = queue.state(found)
        if before in queue.TERMINAL:
            flash(f"Nothing to cancel: the job had already ended ({before}).")
        else:
            queue.cancel(found)
    return redirect(url_for(".job", job_id=job_id))


@bp.route("/submit", methods=("GET", "POST"))
@auth.login_required
def submit():
    models = queue.models()
    if request.method == "POST":
        form = request.form
        body = {"model": form.get("model"), "prompt": form.get("prompt", "")}
        if form.get("chat"):
            body = {"model": body["model"], "messages": [{"role": "user", "content": body["prompt"]}]}
        try:
            body |= {"max_tokens": _form_number(form, "max_tokens", whole=True),   # 0 is refused
                     "temperature": _form_number(form, "temperature", whole=False)}
            priority, _ = schema.job_options({"priority": form.get("priority", "normal")})
            gen = schema.generation(body, chat=None)
            limits.admit(gen["model"])
            job_id, _ = queue.submit(gen, priority=priority,
                                     metadata={"source": "admin"}, kind="admin")
            return redirect(url_for(".job", job_id=job_id))
        except schema.Invalid as e:
            flash(e.message)
    return render_template("submit.html", models=models, priorities=schema.PRIORITIES, form=request.form)


def _form_number(form, name: str, whole: bool) -> int | float | None:
    """A number field as a browser's number input sends it (as typed: '1e3' is 1000); None if empty."""
    raw = form.get(name, "").strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        pass
    try:
        value = float(raw)
    except ValueError:
        raise schema.Invalid(f"{name} must be a number, got {raw[:40]!r}", name) from None
    if whole:
        if not value.is_integer():
            raise schema.Invalid(f"{name} must be a whole number, got {raw[:40]!r}", name)
        return int(value)
    return value


@bp.get("/models")
@auth.login_required
def models():
    served = queue.models()
    return render_template("models.html", files=modelfiles.scan(current_app.config["MODELS_DIR"]), served=served)


@bp.get("/batches")
@auth.login_required
def batches():
    shown, _ = batchwork.listing(None, 100)
    waiting = {name: queue.batch_queue_length(name) for name in sorted(queue.models())}
    return render_template("batches.html", batches=shown, waiting=waiting)


@bp.post("/batches/<batch_id>/cancel")
@auth.login_required
def cancel_batch(batch_id):
    batchwork.cancel(batch_id)
    return redirect(url_for(".batches"))
