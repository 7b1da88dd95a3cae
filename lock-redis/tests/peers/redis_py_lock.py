#!/usr/bin/env python3
"""A peer lock client for lock-redis's tests: redis-py's own `Lock` on one key, driven by
lines on stdin, one answer line on stdout each.

Usage: redis_py_lock.py REDIS_URL KEY TTL_SECONDS

  try      one attempt (SET key token NX PX)  -> acquired | busy
  wait     block until acquired               -> acquired
  release  compare-and-delete                 -> released | lost
  token    the value this client holds        -> the token
"""
import sys

import redis
from redis.exceptions import LockError


def main():
    url, key, ttl = sys.argv[1], sys.argv[2], float(sys.argv[3])
    lock = redis.Redis.from_url(url).lock(key, timeout=ttl, sleep=0.05)
    for line in sys.stdin:
        command = line.strip()
        if command == "try":
            answer = "acquired" if lock.acquire(blocking=False) else "busy"
        elif command == "wait":
            lock.acquire(blocking=True)
            answer = "acquired"
        elif command == "release":
            try:
                lock.release()
                answer = "released"
            except LockError:
                answer = "lost"
        elif command == "token":
            answer = lock.local.token.decode()
        else:
            answer = "unknown command " + command
        print(answer, flush=True)


if __name__ == "__main__":
    main()
