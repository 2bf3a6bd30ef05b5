"""vkllm.outage against a real redis-server: a Redis that refuses writes (MISCONF, READONLY) is away
for the worker's clients and the web app's alike, as an unreachable one is; other command errors
are not. And the worker's check of the Redis version it meets."""
import threading
import time

import pytest
from redis import Redis
from redis.exceptions import OutOfMemoryError, ResponseError

from tests.conftest import _free_port
from tests.test_resilience import RedisServer
from vkllm import outage, protocol
from vkllm.errors import VkllmError
from worker.service.redislink import check_version, connect, wait_for_redis


@pytest.fixture
def server(tmp_path):
    s = RedisServer(tmp_path / "redis")
    yield s
    if (s.folder / "dump.rdb").is_dir():
        s.accept_writes()
    if s.proc.poll() is None:
        s.stop()


def test_misconf_is_away_and_a_patient_command_waits_until_writes_are_accepted(server):
    patient, link = connect(server.url)
    server.refuse_writes()
    with pytest.raises(outage.UNAVAILABLE) as refused:
        link.set("k", "v")
    assert isinstance(refused.value, outage.RefusesWrites)
    assert outage.describe(refused.value).startswith("refuses writes: MISCONF Redis is configured to save")
    assert link.get("k") is None   # reads go on
    with pytest.raises(outage.RefusesWrites):   # a transaction's queued write: the whole transaction
        with link.pipeline() as pipe:
            pipe.xadd("s", {"a": "1"}, id="0-1")
            pipe.exists("k")
            pipe.execute(raise_on_error=False)
    with pytest.raises(outage.RefusesWrites):   # PING too, as Redis refuses it then
        link.ping()

    done = threading.Event()
    threading.Thread(target=lambda: (patient.set("k", "v"), done.set()), daemon=True).start()
    assert not done.wait(1.5)   # still waiting
    server.accept_writes()
    assert done.wait(10) and link.get("k") == b"v"


def test_a_replica_refuses_writes_until_it_is_the_primary(server):
    patient, link = connect(server.url)
    admin = Redis.from_url(server.url)
    admin.replicaof("127.0.0.1", _free_port())   # a primary that is not there
    with pytest.raises(outage.RefusesWrites) as refused:
        link.set("k", "v")
    assert outage.describe(refused.value) == "refuses writes: READONLY You can't write against a read only replica."
    done = threading.Event()
    threading.Thread(target=lambda: (patient.set("k", "v"), done.set()), daemon=True).start()
    time.sleep(1)
    assert not done.is_set()
    admin.replicaof("no", "one")   # the failover
    assert done.wait(10) and link.get("k") == b"v"


def test_other_errors_and_an_unreachable_redis(server):
    _, link = connect(server.url)
    link.set("k", "v")
    with pytest.raises(ResponseError) as wrong:   # a command error is the caller's, not an outage
        link.lpush("k", "x")
    assert not isinstance(wrong.value, outage.UNAVAILABLE)
    server.stop()
    with pytest.raises(outage.UNAVAILABLE) as away:
        link.get("k")
    assert outage.describe(away.value) == "unreachable"


def test_a_redis_older_than_the_take_needs_is_refused_with_a_line(server):
    """The worker takes jobs with LMOVE (Redis 6.2): an older Redis is named and refused before
    the worker registers, not met by a script error at its first take. The real server here
    passes (once it accepts writes: the wait reads the version after a PING, which a Redis
    refusing writes refuses); the versions of older releases (as INFO server gives them) are
    refused."""
    _, link = connect(server.url)
    wait_for_redis(link)
    server.refuse_writes()   # INFO answers, PING is refused: the worker waits until writes are accepted
    waited = threading.Thread(target=wait_for_redis, args=(link,), daemon=True)
    waited.start()
    waited.join(2)
    assert waited.is_alive()
    server.accept_writes()
    waited.join(10)
    assert not waited.is_alive()
    for version in ("6.2.0", "7.0.15", "10.0.1"):
        check_version(version, "h:1")
    for version in ("6.0.16", "5.0.14"):
        with pytest.raises(VkllmError) as old:
            check_version(version, "h:1")
        assert str(old.value) == (f"Redis at h:1 is {version}; the worker needs Redis 6.2 or later "
                                  f"(it takes jobs with LMOVE)")


def test_apikey_rotate_against_a_redis_refusing_writes_is_one_line(server):
    """`vkllm apikey rotate` against a Redis that refuses writes: one 'error:' line with Redis's
    reason, exit 2, the stored key unchanged (it was a ResponseError traceback)."""
    from tests.test_api_cli import vkllm
    Redis.from_url(server.url).set(protocol.API_KEY_HASH, "before")
    server.refuse_writes()
    done = vkllm("apikey", "rotate", "--redis-url", server.url, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines()[-1].startswith(f"vkllm: error: Redis at {server.url} refuses writes: MISCONF "), \
        done.stderr
    server.accept_writes()
    assert Redis.from_url(server.url).get(protocol.API_KEY_HASH) == b"before"


def test_a_full_redis_is_told_from_its_info(server):
    """outage.full, from a real redis-server's INFO memory: no maxmemory, or room under it, is not
    full; a maxmemory below what it uses is, and its writes get OOM."""
    r = Redis.from_url(server.url)
    assert not outage.full(r.info("memory"))
    r.config_set("maxmemory", 100 * 2**20)
    assert not outage.full(r.info("memory"))
    r.config_set("maxmemory", 1)
    assert outage.full(r.info("memory"))
    with pytest.raises(OutOfMemoryError):
        r.set("k", "v")
    r.config_set("maxmemory", 0)
    assert not outage.full(r.info("memory")) and r.set("k", "v")
