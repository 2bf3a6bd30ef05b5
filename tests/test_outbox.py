"""The worker's outbox against a real redis-server, stopped and restarted by pid: the records of
several job streams go in one transaction per flush, in order per stream, never twice, and wait
out an outage without holding up the caller."""
import time

import pytest
from redis import Redis

from tests.test_resilience import RedisServer
from vkllm import protocol
from worker.service.outbox import Outbox
from worker.service.redislink import connect


@pytest.fixture
def server(tmp_path):
    s = RedisServer(tmp_path / "redis")
    yield s
    if s.proc.poll() is None:
        s.stop()


def texts(r: Redis, stream: str) -> list[str]:
    return [protocol.parse(fields)[1].get("text", "<error>") for _, fields in r.xrange(stream)]


def token(text: str) -> dict:
    return protocol.record(protocol.TOKEN, text=text)


def test_one_flush_carries_every_stream_and_the_steps_other_commands(server):
    r = Redis.from_url(server.url)
    r.set("flag-b", 1)
    outbox = Outbox(connect(server.url)[1])
    for stream in ("s:a", "s:b"):
        outbox.open(stream, ttl=100)
    for i in range(3):
        outbox.send("s:a", token(f"a{i}"))
        outbox.send("s:b", token(f"b{i}"))
    replies = outbox.flush(lambda pipe: (pipe.exists("flag-a"), pipe.exists("flag-b")))
    assert replies == [0, 1]
    assert texts(r, "s:a") == ["a0", "a1", "a2"] and texts(r, "s:b") == ["b0", "b1", "b2"]
    assert [entry_id for entry_id, _ in r.xrange("s:b")] == [b"0-1", b"0-2", b"0-3"]
    assert 0 < r.ttl("s:a") <= 100
    assert not outbox.waiting("s:a") and outbox.flush() == []


def test_records_sent_again_are_not_written_twice_and_a_closed_stream_takes_no_more(server):
    """A resent flush (Redis applied it, the reply was cut) carries the same ids: Redis refuses them."""
    r = Redis.from_url(server.url)
    link = connect(server.url)[1]
    first, again = Outbox(link), Outbox(link)
    for outbox in (first, again):
        outbox.open("s:a", ttl=100)
        for text in ("x", "y"):
            outbox.send("s:a", token(text))
        assert outbox.flush() == []
    assert texts(r, "s:a") == ["x", "y"]
    r.xadd("s:a", protocol.record(protocol.ERROR, error="closed"))   # as the orphan watchdog does
    again.send("s:a", token("late"))
    assert again.flush() == []
    assert texts(r, "s:a") == ["x", "y", "<error>"]


def test_an_outage_holds_the_records_in_order_and_costs_the_caller_nothing(server):
    r = Redis.from_url(server.url)
    outbox = Outbox(connect(server.url)[1])
    outbox.open("s:a", ttl=100)
    outbox.open("s:b", ttl=100)
    outbox.send("s:a", token("before"))
    assert outbox.flush() == [] and outbox.up
    server.stop()
    start = time.monotonic()
    for i in range(200):   # steps go on while Redis is away
        outbox.send("s:a" if i % 2 else "s:b", token(str(i)))
        assert outbox.flush(lambda pipe: pipe.exists("anything")) is None
    assert time.monotonic() - start < 2.5   # one failed try, then backoff: no wait per step
    assert not outbox.up and outbox.waiting("s:a") and outbox.waiting("s:b")
    server.start()
    assert outbox.drain(time.monotonic() + 30)
    assert outbox.up and not outbox.waiting("s:a")
    assert texts(r, "s:a") == ["before"] + [str(i) for i in range(1, 200, 2)]
    assert texts(r, "s:b") == [str(i) for i in range(0, 200, 2)]
