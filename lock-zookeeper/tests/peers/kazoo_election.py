#!/usr/bin/python3
"""A peer for lock-zookeeper's interop tests: the real kazoo Election (Debian's python3-kazoo),
built on kazoo's Lock: its identifier is its lock node's data.

    /usr/bin/python3 kazoo_election.py <hosts> <path> <identifier>

Runs for the election on <path> with <identifier> and reads commands on stdin: "leader" prints
"LEADER <identifier>" (the first of contenders(); nothing after the space when there is none),
"resign" ends its leadership and prints "RESIGNED" once its node is gone. It prints "ELECTED"
when it takes the leadership. Run it with /usr/bin/python3: Debian's kazoo is installed for the
system interpreter only. Exit codes: 0 ok (stdin closed), 2 usage, 1 error.
"""
import sys
import threading

from kazoo.client import KazooClient

# Lines are written from two threads: one lock keeps each whole.
OUT = threading.Lock()


def say(line):
    with OUT:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def main(argv):
    if len(argv) != 4:
        sys.stderr.write("usage: kazoo_election.py <hosts> <path> <identifier>\n")
        return 2
    hosts, path, identifier = argv[1], argv[2], argv[3]
    zk = KazooClient(hosts=hosts, timeout=10.0)
    zk.start(timeout=30)
    try:
        election = zk.Election(path, identifier)
        resign = threading.Event()

        def lead():
            say("ELECTED")
            resign.wait()

        # run() returns once its lock is released (its node deleted).
        runner = threading.Thread(target=election.run, args=(lead,), daemon=True)
        runner.start()
        for line in sys.stdin:
            command = line.strip()
            if command == "leader":
                contenders = election.contenders()
                say("LEADER " + (contenders[0] if contenders else ""))
            elif command == "resign":
                resign.set()
                runner.join()
                say("RESIGNED")
            else:
                sys.stderr.write("unknown command: %s\n" % command)
                return 2
        election.cancel()
    finally:
        zk.stop()
        zk.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
