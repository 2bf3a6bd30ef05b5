"""The Files API's storage when the data volume fails it: a real tmpfs, full or remounted
read-only, under a real Redis (mounting needs root, as the compose tests do)."""
import io
import os
import subprocess

import pytest

from tests.conftest import API_KEY

AUTH = {"Authorization": f"Bearer {API_KEY}"}
LINE = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n'


@pytest.fixture
def volume(tmp_path):
    """A 256 KiB tmpfs mounted for the test."""
    folder = tmp_path / "volume"
    folder.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(folder)],
                      capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root")
    yield folder
    subprocess.run(["umount", str(folder)], check=True)


def _upload(client, body: bytes):
    return client.post("/v1/files", headers=AUTH, content_type="multipart/form-data",
                       data={"purpose": "batch", "file": (io.BytesIO(body), "requests.jsonl")})


def test_an_upload_the_data_volume_cannot_take_is_a_json_error_and_leaves_nothing(redis_url, volume):
    """A full or read-only data volume was a 500 HTML page (an OSError's traceback in the log),
    which the openai client reports as 'The server encountered an internal error'."""
    from appliance.app import create_app
    app = create_app({"REDIS_URL": redis_url, "API_KEY": API_KEY, "SECRET_KEY": "test-secret", "TESTING": True,
                      "DATA_DIR": str(volume)})
    client = app.test_client()
    full = _upload(client, LINE * (400_000 // len(LINE)))
    assert full.status_code == 507, full.data[:300]
    assert full.json["error"] | {"message": None} == {"code": "storage_full", "param": None, "message": None,
                                                      "type": "server_error"}
    assert full.json["error"]["message"] == "the file could not be stored: No space left on device"
    assert os.listdir(volume / "files") == []   # no partial file left taking the space
    assert _upload(client, LINE).status_code == 200   # what fits is stored

    subprocess.run(["mount", "-o", "remount,ro", str(volume)], check=True)
    refused = _upload(client, LINE)
    assert refused.status_code == 503, refused.data[:300]
    assert refused.json["error"]["code"] == "storage_unavailable"
    assert refused.json["error"]["message"] == "the file could not be stored: Read-only file system"
