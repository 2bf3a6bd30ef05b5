"""Terminal client of the REST API: `vkllm submit`, `vkllm jobs`, `vkllm follow` (standard
library HTTP, so it runs anywhere the CLI does)."""
import json
import sys
import urllib.error
import urllib.parse
import urllib.request

from vkllm.errors import VkllmError
from vkllm.sampling_defaults import SERVER as SAMPLING_DEFAULTS


class Client:
    def __init__(self, url: str, api_key: str | None):
        if not api_key:
            raise VkllmError("an API key is needed: pass --api-key or set VKLLM_API_KEY")
        if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
            raise VkllmError(f"--url must be an http:// or https:// address, not {url!r}")
        self.url, self.headers = url.rstrip("/"), {"Authorization": f"Bearer {api_key}"}

    def _open(self, method: str, path: str, body: dict | None = None, timeout: float | None = 30):
        data = json.dumps(body).encode() if body is not None else None
        headers = self.headers | ({"Content-Type": "application/json"} if data else {})
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            return urllib.request.urlopen(req, timeout=timeout)
        except urllib.error.HTTPError as e:
            try:
                message = json.load(e)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = e.reason
            raise VkllmError(f"{e.code}: {message}") from None
        except urllib.error.URLError as e:
            raise VkllmError(f"cannot reach {self.url}: {e.reason}") from None

    def call(self, method: str, path: str, body: dict | None = None) -> dict:
        with self._open(method, path, body) as response:
            return json.load(response)

    def events(self, job_id: str):
        """(type, data) of the job's Server-Sent Events, until its end."""
        with self._open("GET", f"{job_path(job_id)}/stream", timeout=None) as response:
            kind = None
            for raw in response:
                line = raw.decode().rstrip("\n")
                if line.startswith("event: "):
                    kind = line[7:]
                elif line.startswith("data: "):
                    yield kind, json.loads(line[6:])
                    if kind in ("end", "error"):
                        return


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
