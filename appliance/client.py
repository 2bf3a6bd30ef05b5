"""Terminal client of the REST API: `vkllm submit`, `vkllm jobs`, `vkllm follow` (standard
library HTTP, so it runs anywhere the CLI does)."""
import http.client
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

from vkllm.errors import VkllmError
from vkllm.sampling_defaults import SERVER as SAMPLING_DEFAULTS

RESUME_PATIENCE = 300   # seconds `follow` goes on trying to resume a stream cut short
RESUME_PAUSE = 1.0      # seconds between those tries


class Unavailable(VkllmError):
    """The server, or its Redis, cannot answer now: asking again later may work."""


class Client:
    def __init__(self, url: str, api_key: str | None):
        if not api_key:
            raise VkllmError("an API key is needed: pass --api-key or set VKLLM_API_KEY")
        if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
            raise VkllmError(f"--url must be an http:// or https:// address, not {url!r}")
        self.url, self.headers = url.rstrip("/"), {"Authorization": f"Bearer {api_key}"}

    def _open(self, method: str, path: str, body: dict | None = None, timeout: float | None = 30,
              headers: dict | None = None):
        data = json.dumps(body).encode() if body is not None else None
        headers = self.headers | ({"Content-Type": "application/json"} if data else {}) | (headers or {})
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            return urllib.request.urlopen(req, timeout=timeout)
        except urllib.error.HTTPError as e:
            try:
                message = json.load(e)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = e.reason
            raise (Unavailable if e.code in (502, 503, 504) else VkllmError)(f"{e.code}: {message}") from None
        except urllib.error.URLError as e:
            raise Unavailable(f"cannot reach {self.url}: {e.reason}") from None

    def call(self, method: str, path: str, body: dict | None = None) -> dict:
        with self._open(method, path, body) as response:
            return json.load(response)

    def events(self, job_id: str):
        """(type, data) of the job's Server-Sent Events, until its end. A stream cut short (the
        server restarting, or its Redis away longer than it waits: an error event of kind
        "unavailable", which says nothing of the job) is resumed after the last event seen
        (Last-Event-ID), while tries fail for up to RESUME_PATIENCE seconds."""
        last, cut_since = None, None
        while True:
            try:
                with self._open("GET", f"{job_path(job_id)}/stream", timeout=None,
                                headers={"Last-Event-ID": last} if last else None) as response:
                    cut_since = None
                    for eid, kind, data in _server_sent_events(response):
                        if kind == "error" and data.get("kind") == "unavailable":
                            break
                        last = eid
                        yield kind, data
                        if kind in ("end", "error"):
                            return
            except (Unavailable, OSError, http.client.HTTPException):
                pass
            cut_since = cut_since or time.monotonic()
            if time.monotonic() - cut_since > RESUME_PATIENCE:
                raise VkllmError(f"the stream of job {job_id} was cut off and could not be resumed "
                                 f"for {RESUME_PATIENCE} s; `vkllm follow {job_id}` tries again")
            time.sleep(RESUME_PAUSE)


def _server_sent_events(response):
    """(id, type, data) of each event of an SSE response."""
    eid = kind = None
    for raw in response:
        line = raw.decode().rstrip("\n")
        if line.startswith("id: "):
            eid = line[4:]
        elif line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: "):
            yield eid, kind, json.loads(line[6:])


def job_path(job_id: str) -> str:
    """The job's URL path: its id as one path segment, whatever characters it holds."""
    return "/api/v1/jobs/" + urllib.parse.quote(job_id, safe="")


def follow(client: Client, job_id: str, out=sys.stdout) -> int:
    """Print the text as it comes; on a terminal, a progress bar on stderr counts the tokens."""
    from tqdm import tqdm
    job = client.call("GET", job_path(job_id))
    total = (job.get("progress") or {}).get("max_tokens")
    bar = tqdm(total=total, unit="tok", file=sys.stderr, disable=not sys.stderr.isatty(), leave=False)
    status = 0
    for kind, data in client.events(job_id):
        if kind == "token":
            out.write(data["text"])
            out.flush()
            bar.update(1)
        elif kind == "error":
            status = 1
            print(f"\njob {job_id} failed: {data['error']}", file=sys.stderr)
        else:
            print(f"\n[{data['finish_reason']}]", file=sys.stderr)
    bar.close()
    return status


def run(args) -> int:
    client = Client(args.url, args.api_key)
    if args.command == "submit":
        body = {"model": args.model, "priority": args.priority}
        body |= {"messages": [{"role": "user", "content": args.prompt}]} if args.chat else {"prompt": args.prompt}
        options = ("max_tokens", "seed", *SAMPLING_DEFAULTS)
        body |= {k: getattr(args, k) for k in options if getattr(args, k) is not None}
        job = client.call("POST", "/api/v1/jobs", body)
        applied = ", ".join(f"{k} {v}" for k, v in job["params"].items())
        print(f"{job['id']} queued at position {job['queue_position']} ({applied})", file=sys.stderr)
        return follow(client, job["id"]) if args.follow else 0
    if args.command == "jobs":
        query = f"?limit={args.limit}" + (f"&state={args.state}" if args.state else "")
        for job in client.call("GET", f"/api/v1/jobs{query}")["data"]:
            progress = job.get("progress") or {}
            print(f"{job['id']}  {job['state']:9}  {job['model']}  "
                  f"{progress.get('tokens', 0)}/{progress.get('max_tokens', '?')} tokens")
        return 0
    return follow(client, args.job_id)
