// The Curator side of fencelock-zookeeper's bench (bench/benches/zookeeper): Apache Curator's
// InterProcessMutex (Debian's libcurator-recipes-java), timed in this JVM with System.nanoTime
// by the same loops the Rust side times its own lock with, so that the two are measured the
// same way, in the same run, against the same server. The bench compiles this file with javac
// and runs it once; it stays up between rounds (so its JIT stays warm), taking commands on
// stdin and answering each with one line on stdout.
//
//   java -cp CP CuratorBench <connectString> <clients>
//       opens <clients> CuratorFrameworks (one ZooKeeper session each), prints "READY".
//   cycle <path> <n>      client 0: n uncontended acquire() + release()
//   handoff <path> <n>    every client a waiter on <path>, one thread each, as
//                         fencelock_bench::handoff_between (Handoff::AnyWaiter):
//                         a holder notes the time, calls release() and at once acquire()
//                         again; a sample is that time to the next acquire() returning,
//                         whoever it returns in; until n samples
//   quiet <path> <n>      clients 0 and 1: 0 holds, 1 queues behind it (its node seen in the
//                         queue, then 20 ms parked in its wait), then release() on 0; a
//                         sample is that call to 1's acquire() returning
//   quit
// Each command answers "OK <sample ns> <sample ns> ..." or "ERROR <what>".
// Exit codes: 0 after quit, 2 usage, 1 could not connect.
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.ExponentialBackoffRetry;

public final class CuratorBench {
    /** How long the quiet waiter is parked in its wait before the release. */
    static final long PARKED_MS = 20;

    public static void main(String[] args) throws Exception {
        if (args.length != 2) {
            System.err.println("usage: CuratorBench <connectString> <clients>");
            System.exit(2);
        }
        List<CuratorFramework> clients = new ArrayList<>();
        for (int i = 0; i < Integer.parseInt(args[1]); i++) {
            CuratorFramework c = CuratorFrameworkFactory.newClient(
                    args[0], 10_000, 10_000, new ExponentialBackoffRetry(50, 5));
            c.start();
            if (!c.blockUntilConnected(15, TimeUnit.SECONDS)) {
                System.err.println("could not connect to " + args[0]);
                System.exit(1);
            }
            clients.add(c);
        }
        System.out.println("READY");
        System.out.flush();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        for (String line; (line = in.readLine()) != null; ) {
            String[] words = line.trim().split(" ");
            if (words[0].equals("quit")) {
                break;
            }
            String answer;
            try {
                String path = words[1];
                int n = Integer.parseInt(words[2]);
                long[] samples;
                switch (words[0]) {
                    case "cycle": samples = cycle(clients.get(0), path, n); break;
                    case "handoff": samples = handoff(clients, path, n); break;
                    case "quiet": samples = quiet(clients.get(0), clients.get(1), path, n); break;
                    default: throw new IllegalArgumentException("unknown command " + words[0]);
                }
                StringBuilder out = new StringBuilder("OK");
                for (long s : samples) {
                    out.append(' ').append(s);
                }
                answer = out.toString();
            } catch (Exception e) {
                answer = "ERROR " + String.valueOf(e).replace('\n', ' ');
            }
            System.out.println(answer);
            System.out.flush();
        }
        for (CuratorFramework c : clients) {
            c.close();
        }
        System.exit(0);
    }

    static long[] cycle(CuratorFramework client, String path, int n) throws Exception {
        InterProcessMutex mutex = new InterProcessMutex(client, path);
        long[] samples = new long[n];
        for (int i = 0; i < n; i++) {
            long started = System.nanoTime();
            mutex.acquire();
            mutex.release();
            samples[i] = System.nanoTime() - started;
        }
        return samples;
    }

    /** handoff_between's loop: see the header. */
    static long[] handoff(List<CuratorFramework> clients, String path, int n) throws Exception {
        final Object lock = new Object();
        final long[] releasedAt = { -1 };
        final boolean[] done = { false };
        final List<Long> samples = new ArrayList<>();
        final List<Exception> failures = new ArrayList<>();
        List<Thread> threads = new ArrayList<>();
        for (CuratorFramework client : clients) {
            InterProcessMutex mutex = new InterProcessMutex(client, path);
            Thread t = new Thread(() -> {
                try {
                    for (;;) {
                        mutex.acquire();
                        long now = System.nanoTime();
                        boolean finished;
                        synchronized (lock) {
                            if (releasedAt[0] >= 0) {
                                samples.add(now - releasedAt[0]);
                                releasedAt[0] = -1;
                            }
                            if (samples.size() >= n) {
                                done[0] = true;
                            }
                            finished = done[0];
                            if (!finished) {
                                releasedAt[0] = System.nanoTime();
                            }
                        }
                        mutex.release();
                        if (finished) {
                            // Every waiter takes the key once more, sees the run done, and
                            // gives it back: the last one leaves the path empty.
                            return;
                        }
                    }
                } catch (Exception e) {
                    synchronized (lock) {
                        failures.add(e);
                        done[0] = true;
                    }
                }
            });
            t.setDaemon(true);
            threads.add(t);
            t.start();
        }
        for (Thread t : threads) {
            t.join();
        }
        if (!failures.isEmpty()) {
            throw failures.get(0);
        }
        long[] out = new long[samples.size()];
        for (int i = 0; i < out.length; i++) {
            out[i] = samples.get(i);
        }
        return out;
    }

    static long[] quiet(CuratorFramework first, CuratorFramework second, String path, int n)
            throws Exception {
        InterProcessMutex holder = new InterProcessMutex(first, path);
        InterProcessMutex waiter = new InterProcessMutex(second, path);
        // InterProcessMutex is owned by the thread that acquired it: the waiter has its own.
        ExecutorService waiting = Executors.newSingleThreadExecutor();
        long[] samples = new long[n];
        try {
            for (int i = 0; i < n; i++) {
                holder.acquire();
                Future<Long> granted = waiting.submit(() -> {
                    waiter.acquire();
                    long at = System.nanoTime();
                    waiter.release();
                    return at;
                });
                while (holder.getParticipantNodes().size() < 2) {
                    Thread.sleep(1);
                }
                Thread.sleep(PARKED_MS);
                long released = System.nanoTime();
                holder.release();
                samples[i] = granted.get(30, TimeUnit.SECONDS) - released;
            }
        } finally {
            waiting.shutdownNow();
        }
        return samples;
    }
}
