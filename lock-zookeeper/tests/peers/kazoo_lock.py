#!/usr/bin/python3
"""A peer for lock-zookeeper's interop tests: the real kazoo Lock (Debian's python3-kazoo).

    /usr/bin/python3 kazoo_lock.py <hosts> <path>

Acquires kazoo's Lock on <path> (blocking), prints "HELD <node name> <czxid>", waits for one
line on stdin, releases, prints "RELEASED". Run it with /usr/bin/python3: Debian's kazoo is
installed for the system interpreter only. Exit codes: 0 ok, 2 usage, 1 error.
"""
import sys

from kazoo.client import KazooClient


def main(argv):
    if len(argv) != 3:
        sys.stderr.write("usage: kazoo_lock.py <hosts> <path>\n")
        return 2
    hosts, path = argv[1], argv[2]
    zk = KazooClient(hosts=hosts, timeout=10.0)
    zk.start(timeout=30)
    try:
        lock = zk.Lock(path, "kazoo_lock.py")
        lock.acquire()
        _, stat = zk.get(path + "/" + lock.node)
        print("HELD %s %d" % (lock.node, stat.czxid), flush=True)
        sys.stdin.readline()
        lock.release()
        print("RELEASED", flush=True)
    finally:
        zk.stop()
        zk.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
